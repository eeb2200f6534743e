"""Helpers shared by the verifiers of the molecule scenarios.

Molecule's testinfra verifier runs pytest on each scenario's ``tests/`` directory; a test
module there imports this one by name: pyproject.toml's pytest ``pythonpath`` (its rootdir is
the repository, wherever pytest is started) puts ``molecule/shared`` on the path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The colour codes Ansible puts around each line of its output when molecule asks for colour.
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def ephemeral(name: str) -> Path:
    """The path ``name`` in the scenario's ephemeral directory, where its playbooks write."""
    return Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / name


def recorded(name: str) -> Any:
    """The JSON file ``name`` that the scenario's playbooks wrote to its ephemeral directory."""
    return json.loads(ephemeral(name).read_text())


def failed_output(run: dict[str, Any]) -> str:
    """The output of a recorded step that must have failed, without colour codes, its whitespace
    folded to single spaces (a message that the callback wrapped over lines reads as one)."""
    assert run["rc"] != 0, f"the step was expected to fail, but exited {run['rc']}"
    return " ".join(ANSI_COLOUR.sub("", run["output"]).split())


def run_offline(playbook: str, extra: dict[str, Any]) -> tuple[int, str]:
    """Run ``playbook`` (relative to the repository) on the controller with the extra variables
    ``extra``, as an operator would, outside molecule's Ansible settings: its exit status and the
    message of the task that failed ("" when none did), its whitespace folded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    ansible_playbook = shutil.which("ansible-playbook") or str(REPO / ".venv/bin/ansible-playbook")
    proc = subprocess.run(
        [ansible_playbook, str(REPO / playbook), "-e", json.dumps(extra)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    results = [
        result
        for play in json.loads(proc.stdout)["plays"]
        for task in play["tasks"]
        for result in task["hosts"].values()
    ]
    return proc.returncode, " ".join(next((r["msg"] for r in results if r.get("failed")), "").split())
