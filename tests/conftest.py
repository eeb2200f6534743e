"""Shared pytest setup: the repository root, the import path and the controller cache locations.

The tests sit in one folder per component (launch_plan/, health_gate/, model_sync/, nightly/,
gateway/, bakeoff/, roles/, tools/), each with its own conftest.py for that component's
fixtures. What several folders use is here or in shared/ (on the path through
pyproject.toml's pytest ``pythonpath``): the gate's fakes (``gate_fakes``, ``fake_sglang_lm``,
on the fake HTTP server of ``fake_http``) and the rehearsal engine (``rehearsal_engine``).
The controller's code (the launch plan, the tools') is the package ``deploytools``, installed
in the venv (pyproject.toml, ``make setup``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# Each test file's seconds in the last measured run (the order below); --record-durations writes it.
DURATIONS = REPO / "tests" / "durations.json"
# The helpers the test folders share (tests/shared). The controller's package, deploytools
# (tools/deploytools), comes installed in the venv by make setup (pyproject.toml).


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say that the sglang_newest tests did not run (launch_plan/conftest.py deselects them).

    Also under pytest-xdist, whose summary leaves deselected tests out of its counts."""
    if "sglang_newest" in (config.option.markexpr or ""):
        return
    launch_plan = REPO / "tests" / "launch_plan"
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if any(p == launch_plan or launch_plan in p.parents or p in launch_plan.parents for p in paths):
        terminalreporter.write_line(
            "sglang_newest: the tests of the SGLang versions whose check venv make test does not build "
            "were deselected, not run: make sglang-check-newest runs them"
        )


@pytest.fixture(scope="session")
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """The controller cache (DEPLOY_CACHE_DIR, default <repo>/.cache) built by make."""
    return Path(os.environ.get("DEPLOY_CACHE_DIR", REPO / ".cache"))


@pytest.fixture
def searchable_tmp() -> Iterator[Path]:
    """A directory under /tmp that every account can search (pytest's tmp_path sits under a 0700
    directory of root), for the tests that try another account on real files, then removed."""
    path = Path(tempfile.mkdtemp(prefix="pytest-searchable-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


# The gate's fake server (tests/shared/gate_fakes.py) as a fixture: the health gate's tests
# and the API key's (launch_plan/test_api_key.py) use it.
@pytest.fixture
def fake_server():
    """Factory: ``fake_server(**scenario)`` returns a started :class:`FakeLLMServer`."""
    from gate_fakes import FakeLLMServer

    servers: list[FakeLLMServer] = []

    def make(**scenario: Any) -> FakeLLMServer:
        server = FakeLLMServer(**scenario).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


# make pytest runs the files on PYTEST_WORKERS workers (three), a file's tests on one worker and in order (--dist
# loadfile), each worker taking the next file in collection order when it ends one
# (--no-loadscope-reorder; pytest-xdist's own order is by number of tests, which left a slow
# file of few tests to run alone at the end). The slowest files go first, by their seconds in
# tests/durations.json; a file it does not list goes before them all (a new slow file then never
# ends up alone at the end; a new fast one costs nothing there). The order within a file is kept.
def pytest_addoption(parser: pytest.Parser) -> None:
    """--record-durations FILE: write each test file's seconds (setup, call and teardown) to FILE."""
    parser.addoption(
        "--record-durations",
        metavar="FILE",
        help="write each test file's seconds to FILE (refresh tests/durations.json with a whole run of tests/)",
    )


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the files that took longest first (unknown files before them), keeping each file's own order."""
    try:
        seconds: dict[str, float] = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -seconds.get(_repo_path(item.path), float("inf")))


def _repo_path(path: Path) -> str:
    """A test file's path from the repository root (as tests/durations.json names it, wherever pytest runs)."""
    return path.resolve().relative_to(REPO).as_posix()


_FILE_SECONDS: defaultdict[str, float] = defaultdict(float)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each phase's seconds to its file (on the controller, the workers' reports arrive here too)."""
    _FILE_SECONDS[report.location[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write --record-durations' file, once, from the controller (never from an xdist worker)."""
    out = session.config.getoption("record_durations")
    if out and not hasattr(session.config, "workerinput"):
        root = session.config.rootpath
        files = defaultdict(float)
        for location, seconds in _FILE_SECONDS.items():
            files[_repo_path(root / location)] += seconds
        ranked = dict(sorted(((f, round(s, 1)) for f, s in files.items()), key=lambda fs: -fs[1]))
        Path(out).write_text(json.dumps(ranked, indent=1) + "\n", encoding="utf-8")
