"""tools/reliability-report: the page is rendered from the scenario's results only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# molecule/shared (pyproject.toml's pytest pythonpath): the scenarios' writer of result rows.
from result_rows import check_rows, write_results

TOOL = Path(__file__).resolve().parents[2] / "tools" / "reliability-report"

RESULTS = {
    "schema": 1,
    "generated": "2026-11-30T01:00:00Z",
    "commit": "abc1234",
    "duration_s": 300.0,
    "machine": {"cpus": 2, "load_avg": [1.0, 1.5, 2.0]},
    "image": "local/img:1",
    "pytest_exit_status": 1,
    "rows": [
        {
            "table": "bad_input",
            "case": "port taken",
            "how": "a squatter",
            "message": "Port 8001 | taken.",
            "refused_by": "preflight : Refuse",
            "changed": 0,
            "untouched": True,
            "seconds": 3.1,
            "matched": True,
            "test": "tests/test_1_bad_input.py::test_bad_input[port-taken]",
            "outcome": "passed",
        },
        {
            "table": "bad_input",
            "case": "bad",
            "how": "x",
            "message": "m",
            "refused_by": "t",
            "changed": 2,
            "untouched": False,
            "seconds": 1.0,
            "matched": False,
            "test": "tests/test_1_bad_input.py::test_bad_input[bad]",
            "outcome": "failed",
        },
        {
            "table": "faults",
            "fault": "crash",
            "how": "kill -9",
            "happened": "died",
            "host_did": "rolled back",
            "message": "Deploy step failed",
            "recover_s": 23.8,
            "rc": 2,
            "test": "tests/test_2_faults.py::test_crash",
            "outcome": "passed",
        },
        {
            "table": "faults",
            "fault": "two at once",
            "how": "a second deploy",
            "happened": "met the lock",
            "host_did": "refused it",
            "recover_s": None,
            "rc": 2,
            "test": "tests/test_2_faults.py::test_two",
            "outcome": "passed",
        },
        {"table": "secrets", "where": "play output", "searched": "9 runs", "found": 0, "outcome": "passed"},
        {
            "table": "secrets_on_purpose",
            "where": "/etc/x/secrets.env",
            "mode": "600 root:root",
            "holds": "HF",
            "outcome": "passed",
        },
        {
            "table": "files",
            "path": "/etc/x",
            "expected": "directory root:inference 0750",
            "found": "directory root:inference 0750",
            "outcome": "passed",
        },
    ],
}


def render(tmp_path: Path, *args: str, results: dict = RESULTS) -> subprocess.CompletedProcess:
    """Run the tool on ``results``, writing tmp_path/page.md."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    return subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--results",
            str(path),
            "--out",
            str(tmp_path / "page.md"),
            "--fleet-results",
            str(tmp_path / "no-fleet.json"),
            *args,
        ],
        capture_output=True,
        text=True,
    )


def test_the_tables_hold_the_rows_with_pipes_escaped(tmp_path):
    proc = render(tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "page.md").read_text()
    assert (
        "| port taken | a squatter | `Port 8001 \\| taken.` | preflight : Refuse | 0 | yes | 3.1 | "
        "test_bad_input[port-taken] |"
    ) in page
    assert (
        "| bad | x | `m` | t | 2 | NO (message NOT as asserted) | 1.0 | test_bad_input[bad]: **NOT PASSED** (failed) |"
        in page
    )
    assert "| crash | kill -9 | died | rolled back Message: `Deploy step failed` | 23.8 | test_crash |" in page
    assert "| refused it | no outage: the server was never down | test_two |" in page
    assert "| play output | 9 runs | 0 |" in page
    assert "7 rows from the scenarios' tests, 1 of them not as expected** (2 bad input, 2 faults" in page
    assert "commit `abc1234`" in page and "pytest exit status 1." in page


def test_check_says_whether_the_page_is_current(tmp_path):
    assert render(tmp_path).returncode == 0
    assert render(tmp_path, "--check").returncode == 0
    (tmp_path / "page.md").write_text("edited by hand\n")
    assert render(tmp_path, "--check").returncode == 1


def test_a_missing_or_foreign_results_file_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--results", str(tmp_path / "none.json"), "--out", str(tmp_path / "page.md")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "run `molecule test -s reliability` first" in proc.stderr
    assert render(tmp_path, results={"schema": 9, "rows": []}).returncode == 2


def test_a_files_rule_counts_by_the_tests_verdict(tmp_path):
    rule = {
        "table": "files",
        "path": "unit main process",
        "expected": "user inference (uid < 1000, nologin)",
        "found": "user inference (uid 999, shell /usr/sbin/nologin)",
    }
    for ok, counted in ((True, 1), (False, 2)):
        results = dict(RESULTS, rows=RESULTS["rows"] + [dict(rule, ok=ok, outcome="passed")])
        assert render(tmp_path, results=results).returncode == 0
        assert (
            f"8 rows from the scenarios' tests, {counted} of them not as expected" in (tmp_path / "page.md").read_text()
        )


def test_a_row_whose_test_failed_or_never_ended_is_not_as_expected(tmp_path):
    # The fault row's own fields say nothing wrong: only its test's outcome does.
    for outcome in ("failed", "skipped", None):
        rows = [dict(r, outcome=outcome) if r.get("fault") == "crash" else r for r in RESULTS["rows"]]
        assert render(tmp_path, results=dict(RESULTS, rows=rows)).returncode == 0
        page = (tmp_path / "page.md").read_text()
        assert "7 rows from the scenarios' tests, 2 of them not as expected" in page
        assert f"test_crash: **NOT PASSED** ({outcome or 'no outcome'})" in page


def test_check_rows_fails_on_a_new_gone_or_changed_row_and_ignores_timings(tmp_path):
    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps(RESULTS))
    timings = [dict(r, recover_s=99.9, seconds=42.0) if r["table"] != "secrets" else r for r in RESULTS["rows"]]
    same = render(tmp_path, "--check-rows", str(committed), results=dict(RESULTS, rows=timings, duration_s=1.0))
    assert same.returncode == 0, same.stderr
    assert not (tmp_path / "page.md").exists()  # --check-rows writes nothing
    changed = [dict(r, outcome="failed") if r.get("fault") == "crash" else r for r in RESULTS["rows"]]
    proc = render(tmp_path, "--check-rows", str(committed), results=dict(RESULTS, rows=changed))
    assert proc.returncode == 1
    assert "row faults/crash: as expected in the committed page, NOT as expected now" in proc.stderr
    fewer = [r for r in RESULTS["rows"] if r.get("fault") != "two at once"]
    proc = render(tmp_path, "--check-rows", str(committed), results=dict(RESULTS, rows=fewer))
    assert proc.returncode == 1 and "row gone faults/two at once" in proc.stderr


ROLLING = {
    "hosts": 3,
    "requests": 812,
    "failed": 0,
    "cut": 0,
    "p50_s": 0.61,
    "p99_s": 1.9,
    "p99_before_s": 0.9,
    "rollout_s": 250.3,
    "gateway": "smg 1.13.0",
    "clients": 4,
    "restarted_hosts": 3,
    "bad_change_stopped_at": "molecule-fleet-1",
    "bad_change_s": 80.2,
    "measured_at": "2026-12-01T14:00:00Z",
    "cpus": 2,
    "phases": {
        "good_change": {"requests": 500, "failed": 0, "cut": 0},
        "bad_change": {"requests": 200, "failed": 0, "cut": 0},
    },
}


def test_the_gateway_rows_carry_the_rolling_figures_and_say_so_when_missing(tmp_path):
    rolling = tmp_path / "rolling.json"
    rolling.write_text(json.dumps(ROLLING))
    assert render(tmp_path, "--rolling", str(rolling)).returncode == 0
    page = (tmp_path / "page.md").read_text()
    assert "## Rolling deploys through the gateway" in page
    assert "| a good change rolled over every host (the drain) |" in page and "| 500 | 0 | 0 |" in page
    assert "molecule-fleet-1 failed its start" in page and "| 200 | 0 | 0 |" in page
    assert "| the gateway in front of the fleet |" in page and "| 812 | 0 | 0 |" in page
    assert "7 rows from the scenarios' tests, 1 of them not as expected" in page
    assert render(tmp_path, "--rolling", str(tmp_path / "none.json")).returncode == 0
    assert "Not measured yet" in (tmp_path / "page.md").read_text()


def test_the_committed_page_is_the_rendering_of_the_committed_results():
    # docs/reliability.md is never edited by hand: it is what the tool makes of the committed
    # results (and the committed rolling-deploy figures), so it cannot claim more than they hold.
    repo = TOOL.parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "--results",
            str(repo / "docs" / "reliability-results.json"),
            "--out",
            str(repo / "docs" / "reliability.md"),
            "--check",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr + " (run make reliability, or tools/reliability-report on the results)"


def test_the_fleet_scenarios_fault_rows_join_the_faults_and_are_counted(tmp_path):
    fleet = tmp_path / "fleet.json"
    row = {
        "table": "faults",
        "id": "controller-killed-put-back",
        "fault": "the controller is killed while the gateway puts a host back",
        "how": "SIGKILL at the put-back",
        "happened": "host 1 out of the gateway",
        "host_did": "the rerun put it back",
        "recover_s": 21.5,
        "test": "molecule/fleet/tests/test_fleet.py::test_put_back",
        "outcome": "passed",
    }
    fleet.write_text(json.dumps({"schema": 1, "generated": "2026-12-03T23:00:00Z", "commit": "abc1234", "rows": [row]}))
    assert render(tmp_path, "--fleet-results", str(fleet)).returncode == 0
    page = (tmp_path / "page.md").read_text()
    assert "8 rows from the scenarios' tests, 1 of them not as expected** (2 bad input, 3 faults" in page
    assert "| the controller is killed while the gateway puts a host back | SIGKILL at the put-back |" in page
    assert "| 21.5 | test_put_back |" in page
    assert "The fleet's 1 fault row(s) come from molecule/fleet" in page and "commit `abc1234`" in page
    # A failed fleet test is a row not as expected, as any other.
    fleet.write_text(json.dumps({"schema": 1, "generated": "x", "rows": [dict(row, outcome="failed")]}))
    assert render(tmp_path, "--fleet-results", str(fleet)).returncode == 0
    page = (tmp_path / "page.md").read_text()
    assert "8 rows from the scenarios' tests, 2 of them not as expected" in page
    assert "test_put_back: **NOT PASSED** (failed)" in page


def test_the_scenarios_writer_gives_results_the_tool_renders_and_checks(tmp_path):
    """molecule/shared/result_rows.py, the one writer of molecule/reliability's and molecule/fleet's rows:
    what it writes the tool reads (schema, commit, the scenario's fields) and compares row by row."""
    committed, produced = tmp_path / "committed.json", tmp_path / "produced.json"
    write_results(committed, RESULTS["rows"], scenario="molecule/fleet", pytest_exit_status=0)
    written = json.loads(committed.read_text())
    assert written["schema"] == 1 and written["rows"] == RESULTS["rows"]
    assert written["scenario"] == "molecule/fleet" and written["pytest_exit_status"] == 0
    assert written["commit"] and written["machine"]["cpus"] and written["generated"].endswith("Z")
    assert render(tmp_path, results=written).returncode == 0
    assert "7 rows from the scenarios' tests, 1 of them not as expected" in (tmp_path / "page.md").read_text()

    write_results(produced, [dict(r, seconds=9.9) for r in RESULTS["rows"]])
    same, said = check_rows(produced, committed)
    assert same, said
    write_results(produced, [dict(r, outcome="failed") if r.get("fault") == "crash" else r for r in RESULTS["rows"]])
    same, said = check_rows(produced, committed)
    assert not same
    assert "row faults/crash: as expected in the committed page, NOT as expected now" in said
