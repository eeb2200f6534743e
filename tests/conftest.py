"""Shared pytest setup: the repository root, the import path and the controller cache locations.

The tests sit in one folder per component (launch_plan/, health_gate/, model_sync/, nightly/,
gateway/, bakeoff/, roles/, tools/), each with its own conftest.py for that component's
fixtures. What several folders use is here or in shared/ (put on ``sys.path`` below):
the gate's fakes (``gate_fakes``) and the rehearsal engine (``rehearsal_engine``). The tools'
code is imported from ``deploytools`` (tools/lib).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# Filter plugins and the tools' package (tools/lib/deploytools) are plain Python modules:
# make them importable, and the helpers the test folders share (tests/shared).
for sub in ("filter_plugins", "tools/lib", "tests/shared"):
    sys.path.insert(0, str(REPO / sub))


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
