"""nightly-deploy as a program, run for real through ansible-runner on the fixture project.

Each run is a real ``ansible_runner.run`` of tests/nightly/fixtures/deploy.yml (two local
hosts; a unit file whose change "restarts" the server ("Restart inference server"); the fixture
health_gate module reporting a chosen figure). The tests check the summary line, the JSON
summary, history.json, the artifacts layout, the lock and the exit codes.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import sys
import time

import pytest
from test_nightly_support import FIXTURE, TOOL, load_tool, run_dirs, run_tool, tool_argv

nd = load_tool()

LINE = re.compile(
    r"^nightly \d{4}-\d\d-\d\dT\d\d:\d\dZ limit=(?P<limit>\S+): (?P<status>OK|FAILED) hosts=(?P<hosts>\d+) "
    r"changed=(?P<changed>\d+) restarts=(?P<restarts>\d+) gate=(?P<gate>.+?) duration=(?P<duration>[\d.]+)s"
    r"(?P<rest>;.*)?$"
)


def parse_line(line: str) -> dict:
    """The fields of a summary line (fails the test when the line does not match)."""
    match = LINE.match(line)
    assert match, f"summary line does not match: {line!r}"
    return match.groupdict()


def test_change_then_noop_then_change(tmp_path):
    """Counts of changed tasks and restarts; a no-op run keeps the unit and still records the gate."""
    art, state = tmp_path / "art", tmp_path / "state"

    first = run_tool(art, state, "-e", "fixture_tps=50")
    assert first.rc == 0, first
    fields = parse_line(first.line)
    assert (fields["status"], fields["hosts"], fields["changed"], fields["restarts"]) == ("OK", "2", "4", "2")
    assert fields["gate"] == "fx1:50.0,fx2:50.0 tok/s"
    summary = first.summary()
    for host in ("fx1", "fx2"):
        h = summary["hosts"][host]
        assert h["changed_tasks"] == [
            "fixture_server : Render the fixture unit",
            "fixture_server : Restart inference server",
        ]
        # the restart as the role reported it (set_stats): the new start of the unit
        assert h["restarts"] == 1 and len(h["restart_invocations"]) == 1
        assert h["changed"] == 2 and h["failed"] == 0
        assert h["gate"]["decode_tps"] == 50.0 and h["gate"]["passed"] is True
        assert h["drop_check"]["verdict"] == "no-baseline"
    first_ids = {h: summary["hosts"][h]["gate"]["unit_invocation_id"] for h in ("fx1", "fx2")}
    assert all(first_ids[h] == summary["hosts"][h]["restart_invocations"][0] for h in ("fx1", "fx2"))
    assert summary["reported_stats"] == "artifact_data.llm_deploy"
    first_run_id = summary["run_id"]
    assert all(first_ids.values())

    noop = run_tool(art, state, "-e", "fixture_tps=49")
    assert noop.rc == 0, noop
    fields = parse_line(noop.line)
    assert (fields["changed"], fields["restarts"]) == ("0", "0")
    summary = noop.summary()
    for host in ("fx1", "fx2"):
        h = summary["hosts"][host]
        assert h["changed_tasks"] == [] and h["restart_invocations"] == []
        assert h["gate"]["unit_invocation_id"] == first_ids[host]
        assert h["unit_same_as_last_run"] is True
        assert h["drop_check"] == {
            "verdict": "ok",
            "previous_decode_tps": 50.0,
            "drop_percent": 2.0,
            "previous_run": first_run_id,
        }
    history = json.loads((art / "history.json").read_text())
    assert [e["decode_tps"] for e in history["hosts"]["fx1"]] == [50.0, 49.0]

    changed = run_tool(art, state, "-e", "fixture_unit_version=2", "--limit", "fx2")
    assert changed.rc == 0, changed
    summary = changed.summary()
    assert list(summary["hosts"]) == ["fx2"]
    assert summary["hosts"]["fx2"]["restarts"] == 1
    assert summary["hosts"]["fx2"]["unit_same_as_last_run"] is False
    assert summary["limit"] == "fx2"

    # Artifacts: one run dir per run, each a private data dir with ansible-runner's artifacts.
    names = run_dirs(art)
    assert len(names) == 3
    run = art / names[-1]
    assert (run / "summary.json").is_file()
    assert json.loads((run / "summary.json").read_text())["run_id"] == names[-1]
    assert (run / "artifacts" / "deploy" / "stdout").read_text().count("Restart inference server") >= 1
    assert (run / "artifacts" / "deploy" / "job_events").is_dir()
    envvars = json.loads((run / "env" / "envvars").read_text())
    assert set(envvars) == {"PATH", "ANSIBLE_NOCOLOR", "ANSIBLE_CONFIG"}
    assert oct((run / "env" / "envvars").stat().st_mode & 0o777) == "0o600"
    assert summary["artifacts"] == str(run)


def test_drop_check_fails_the_run_and_keeps_the_baseline(tmp_path):
    art, state = tmp_path / "art", tmp_path / "state"
    base = run_tool(art, state, "-e", "fixture_tps=50", limit="fx1")
    assert base.rc == 0, base

    drop = run_tool(art, state, "-e", "fixture_tps=39", "--max-drop-percent", "20", limit="fx1")
    assert drop.rc == 1, drop
    fields = parse_line(drop.line)
    assert fields["status"] == "FAILED"
    assert "fx1: decode 39.0 tok/s is 22.0% below the last recorded 50.0 (max 20%)" in drop.line
    assert drop.summary()["hosts"]["fx1"]["drop_check"]["verdict"] == "regression"

    # 18 % below the baseline (50): passes, although 39 was recorded in between.
    ok = run_tool(art, state, "-e", "fixture_tps=41", limit="fx1")
    assert ok.rc == 0, ok
    assert ok.summary()["hosts"]["fx1"]["drop_check"]["previous_decode_tps"] == 50.0
    history = json.loads((art / "history.json").read_text())["hosts"]["fx1"]
    assert [(e["decode_tps"], e["baseline"]) for e in history] == [(50.0, True), (39.0, False), (41.0, True)]

    # A deliberate slowdown is accepted once with --rebaseline and becomes the reference.
    accepted = run_tool(art, state, "-e", "fixture_tps=20", "--rebaseline", limit="fx1")
    assert accepted.rc == 0, accepted
    after = run_tool(art, state, "-e", "fixture_tps=19", limit="fx1")
    assert after.rc == 0, after
    assert after.summary()["hosts"]["fx1"]["drop_check"]["previous_decode_tps"] == 20.0


def test_gate_failure_fails_the_run_with_the_reason_and_json(tmp_path):
    art, state = tmp_path / "art", tmp_path / "state"
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)).strftime(nd.state.RUN_ID_FORMAT)
    recent = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)).strftime(nd.state.RUN_ID_FORMAT)
    for name in (old, recent, "keep-me"):
        (art / name).mkdir(parents=True)
    run = run_tool(
        art, state, "--json", "--keep-days", "14", "-e", "fixture_tps=30", "-e", "fixture_min_tps=40", limit="fx1"
    )
    assert run.rc == 1, run
    summary = json.loads(run.stdout)  # --json: the JSON object alone on stdout
    assert summary == run.summary()
    assert summary["status"] == "FAILED" and summary["exit_code"] == 1
    assert parse_line(run.stderr.strip().splitlines()[-1])["status"] == "FAILED"
    assert summary["hosts"]["fx1"]["gate"]["passed"] is False
    assert summary["hosts"]["fx1"]["failed"] == 1
    assert any("Fail when the gate failed failed: gate FAIL: 30.0 tok/s" in r for r in summary["reasons"])
    assert not any("ansible-playbook exited" in r for r in summary["reasons"])  # the host's reason says it
    # The failing host's figure is recorded, but not as a baseline.
    history = json.loads((art / "history.json").read_text())["hosts"]["fx1"]
    assert history[-1]["decode_tps"] == 30.0 and history[-1]["baseline"] is False
    # Pruned: the 30-day-old run dir only.
    assert summary["pruned"] == [old]
    assert (art / recent).is_dir() and (art / "keep-me").is_dir() and not (art / old).exists()


def test_limit_matching_nothing_fails(tmp_path):
    run = run_tool(tmp_path / "art", tmp_path / "state", limit="no-such-host")
    assert run.rc == 1, run
    fields = parse_line(run.line)
    assert fields["status"] == "FAILED" and fields["hosts"] == "0"
    assert "before any host ran" in run.line


def test_require_gate(tmp_path):
    run = run_tool(
        tmp_path / "art",
        tmp_path / "state",
        "--require-gate",
        "-e",
        "fixture_release_file=/",
        playbook="wait.yml",
        limit="fx1",
    )
    assert run.rc == 1, run
    assert "fx1: the gate reported no decode tok/s (--require-gate)" in run.line
    plain = run_tool(
        tmp_path / "art", tmp_path / "state", "-e", "fixture_release_file=/", playbook="wait.yml", limit="fx1"
    )
    assert plain.rc == 0, plain
    assert parse_line(plain.line)["gate"] == "n/a"


def test_second_run_is_refused_at_once_and_a_signal_cancels(tmp_path):
    art, state = tmp_path / "art", tmp_path / "state"
    state.mkdir(parents=True)
    release = tmp_path / "release"
    holder = subprocess.Popen(
        tool_argv(art, state, "-e", f"fixture_release_file={release}", playbook="wait.yml", limit="fx1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (state / "fx1.started").exists():
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline, "the first run did not start"
            time.sleep(0.2)
        t0 = time.monotonic()
        second = run_tool(art, state, limit="fx1")
        elapsed = time.monotonic() - t0
        assert second.rc == 3, second
        assert f"LOCKED another run holds {art / 'nightly.lock'} (pid={holder.pid} " in second.line
        assert elapsed < 10, f"a locked run must exit at once (took {elapsed:.1f} s)"
        assert len(run_dirs(art)) == 1  # the refused run left nothing behind

        holder.send_signal(signal.SIGTERM)
        out, err = holder.communicate(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 1, (out, err)
    assert "canceled by SIGTERM" in out
    # The lock went with the process: the next run starts.
    release.touch()
    again = run_tool(art, state, "-e", f"fixture_release_file={release}", playbook="wait.yml", limit="fx1")
    assert again.rc == 0, again


def test_timeout_cancels_the_run(tmp_path):
    run = run_tool(
        tmp_path / "art",
        tmp_path / "state",
        "--timeout",
        "3",
        "-e",
        "fixture_release_file={}".format(tmp_path / "never"),
        playbook="wait.yml",
        limit="fx1",
    )
    assert run.rc == 1, run
    assert "canceled after --timeout 3 s" in run.line
    assert run.summary()["runner"]["status"] == "timeout"


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: --limit"),
        (["--limit", "all", "--playbook", "nope.yml"], "nope.yml not found"),
        (["--limit", "all", "--max-drop-percent", "150"], "between 0 and 100"),
        (["--limit", "all", "--keep-days", "-1"], "--keep-days must be >= 0"),
        (["--limit", "all", "--json", "--ansible-output"], "not allowed with argument"),
        (["--limit", "all", "--inventory", "/nonexistent/hosts.yml"], "inventory /nonexistent/hosts.yml not found"),
    ],
)
def test_usage_errors_exit_2(tmp_path, argv, message):
    argv = [
        str(TOOL),
        "--repo",
        str(FIXTURE),
        "--artifacts-dir",
        str(tmp_path / "art"),
        "--inventory",
        str(FIXTURE / "hosts.yml"),
    ] + argv
    proc = subprocess.run([sys.executable] + argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    assert message in proc.stderr
    assert not (tmp_path / "art").exists()


def test_help_documents_exit_codes():
    proc = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for phrase in (
        "0 success",
        "1 the deploy failed",
        "2 usage error",
        "3 another run holds the lock",
        "--keep-days",
        "--max-drop-percent",
        "--limit",
    ):
        assert phrase in text, phrase


def test_default_paths_follow_the_repo(tmp_path):
    opts = nd.cli.parse_options(["--repo", str(FIXTURE), "--limit", "fx1", "--inventory", str(FIXTURE / "hosts.yml")])
    assert opts.artifacts == FIXTURE.resolve() / "artifacts" / "nightly"
    assert opts.lock_file == opts.artifacts / "nightly.lock"
    assert opts.history_file == opts.artifacts / "history.json"
    repo_opts = nd.cli.parse_options(["--limit", "ct129"])
    assert repo_opts.repo == TOOL.resolve().parent.parent
    assert repo_opts.inventories == [repo_opts.repo / "inventory" / "hosts.yml"]
    assert repo_opts.playbook == "deploy.yml"
