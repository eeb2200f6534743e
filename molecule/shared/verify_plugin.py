"""The pytest plugin of the molecule scenarios' verifiers: what their conftests would otherwise repeat.

A scenario's ``tests/conftest.py`` loads it with ``pytest_plugins = ["verify_plugin"]``
(molecule/shared is on pytest's path through pyproject.toml's ``pythonpath``). It gives:

* each test item its phases' reports as ``rep_setup``, ``rep_call`` and ``rep_teardown``, so a
  fixture can tell after ``yield`` whether the test failed (to print a journal, say);
* the fixture ``systemd_exposure``: systemd-analyze security's rating of a unit, printed at the
  end of the run (molecule's verifier runs pytest without ``-s``) and written to
  ``artifacts/sandbox-exposure/<scenario>.json`` of the repository (the ephemeral directory
  goes with destroy); docs/security.md keeps the figures.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The ratings taken in this run: "<unit>.service (label)" -> {"exposure": float, "level": str}.
EXPOSURE = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Attach the report of each phase to the test item as ``rep_<phase>``."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture
def systemd_exposure(request: pytest.FixtureRequest) -> Callable[..., tuple[float, str]]:
    """``systemd_exposure(host, unit, label)``: the overall exposure systemd-analyze gives ``unit``, and its table."""

    def rate(host: Any, unit: str, label: str = "") -> tuple[float, str]:
        out = host.run(f"systemd-analyze security --no-pager {unit}.service")
        match = re.search(rf"Overall exposure level for {re.escape(unit)}\.service: ([0-9.]+) (\S+)", out.stdout)
        assert match, out.stdout + out.stderr
        name = f"{unit}.service{f' ({label})' if label else ''}"
        scores = request.config.stash.setdefault(EXPOSURE, {})
        scores[name] = {"exposure": float(match.group(1)), "level": match.group(2)}
        scenario = os.environ.get("MOLECULE_SCENARIO_NAME", "scenario")
        out_dir = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", ".")) / "artifacts" / "sandbox-exposure"
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{scenario}.json").write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n")
        return float(match.group(1)), out.stdout

    return rate


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print every rating taken, pass or fail."""
    for name, score in config.stash.get(EXPOSURE, {}).items():
        terminalreporter.write_line(f"systemd-analyze security {name}: {score['exposure']} {score['level']}")
