"""Each test's outcome for fixtures, the journals on failure; systemd-analyze's rating of the unit."""

import json
import os
import re
from pathlib import Path

import pytest

EXPOSURE = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Attach the report of each phase to the test item as rep_<phase>."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    """Print the journals of the server, its watchdog and its give-up recorder when a check fails."""
    yield
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        units = "-u inference-server -u inference-server-watchdog -u inference-server-gave-up"
        print(host.run(f"journalctl {units} --no-pager -n 200").stdout)


# systemd-analyze security's rating of the scenario's units, printed at the end of the run (molecule's
# verifier runs pytest without -s) and written to artifacts/sandbox-exposure/<scenario>.json of the
# repository (the ephemeral directory goes with destroy); docs/security.md keeps the figures.
@pytest.fixture
def systemd_exposure(request):
    """``systemd_exposure(host, unit, label)``: the overall exposure systemd-analyze gives ``unit``, and its table."""

    def rate(host, unit: str, label: str = "") -> tuple[float, str]:
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


def pytest_terminal_summary(terminalreporter, config):
    """Print every rating taken, pass or fail."""
    for name, score in config.stash.get(EXPOSURE, {}).items():
        terminalreporter.write_line(f"systemd-analyze security {name}: {score['exposure']} {score['level']}")
