"""Shared helpers for the nightly-deploy tests (imported by the other ``test_nightly_*``).

Imports the package behind tools/nightly-deploy (deploytools.nightly), runs the tool as a
program against the fixture project (tests/nightly/fixtures: two local hosts, a unit file whose
change "restarts" the server, a fixture health_gate module, both reported through set_stats as
the real roles do), and reads its JSON summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "nightly-deploy"
FIXTURE = REPO / "tests" / "nightly" / "fixtures"
EVENTS = FIXTURE / "events"


def load_tool() -> ModuleType:
    """The package behind tools/nightly-deploy, every module imported (``nd.events``, ``nd.state``, ``nd.cli``)."""
    import deploytools.nightly.cli  # noqa: F401  (imports the package's other modules)

    return deploytools.nightly


def recorded_event(name: str) -> dict[str, Any]:
    """One recorded job event from tests/nightly/fixtures/events."""
    return json.loads((EVENTS / name).read_text())


class Run:
    """The outcome of one nightly-deploy process."""

    def __init__(self, proc: subprocess.CompletedProcess, artifacts: Path) -> None:
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.artifacts = artifacts

    @property
    def line(self) -> str:
        """The summary line (last line on stdout)."""
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def summary(self) -> dict[str, Any]:
        """latest.json of the artifacts dir."""
        return json.loads((self.artifacts / "latest.json").read_text())

    def __repr__(self) -> str:
        return f"Run(rc={self.rc}, stdout={self.stdout[-2000:]!r}, stderr={self.stderr[-2000:]!r})"


def tool_argv(artifacts: Path, state: Path, *extra: str, playbook: str = "deploy.yml", limit: str = "all") -> list[str]:
    """The command line for one run against the fixture project."""
    return [
        sys.executable,
        str(TOOL),
        "--repo",
        str(FIXTURE),
        "--inventory",
        str(FIXTURE / "hosts.yml"),
        "--playbook",
        playbook,
        "--artifacts-dir",
        str(artifacts),
        "--limit",
        limit,
        "-e",
        f"fixture_state_dir={state}",
        *extra,
    ]


def run_tool(
    artifacts: Path,
    state: Path,
    *extra: str,
    playbook: str = "deploy.yml",
    limit: str = "all",
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> Run:
    """Run nightly-deploy to completion."""
    state.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        tool_argv(artifacts, state, *extra, playbook=playbook, limit=limit),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or dict(os.environ),
    )
    return Run(proc, artifacts)


def run_dirs(artifacts: Path) -> Sequence[str]:
    """Names of the run dirs in ``artifacts``."""
    tool = load_tool()
    return sorted(p.name for p in artifacts.iterdir() if p.is_dir() and tool.state.RUN_ID_RE.match(p.name))


def test_fixture_project_is_complete():
    """The fixture project the other tests run (guards their premise)."""
    for rel in (
        "ansible.cfg",
        "hosts.yml",
        "deploy.yml",
        "wait.yml",
        "library/health_gate.py",
        "roles/fixture_server/tasks/main.yml",
        "events/sim_noop_run.json",
    ):
        assert (FIXTURE / rel).is_file(), rel
    # the fixture reports as the real roles do: set_stats under the key nightly reads
    key = load_tool().events.STATS_KEY + ":"
    assert key in (FIXTURE / "roles/fixture_server/tasks/main.yml").read_text()
    assert key in (FIXTURE / "deploy.yml").read_text()
