"""Unit and PID watching: the gate fails at once, with the journal of this start.

systemctl/journalctl are fakes put first on PATH for these tests only (PID 1 is not
systemd on the development machines); the lead's molecule scenario runs the same code
against real systemd, and bench/gate measures it against a real unit in a systemd
container.
"""

from __future__ import annotations

import subprocess
import time

from gate_fakes import (
    base_options,
    free_port,
    later,
    llm_gate,
    timed,
)

TRACEBACK = (
    [
        "Traceback (most recent call last):",
        '  File "/root/ml-env/lib/python3.12/site-packages/sglang/launch_server.py", line 11, in <module>',
        "    server_args = prepare_server_args(sys.argv[1:])",
    ]
    + [line for i in range(40) for line in (f'  File "/x/server_args.py", line {i:d}, in f{i:d}', "    call()")]
    + [
        "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix "
        "cache when using --mamba-scheduler-strategy no_buffer.",
    ]
)
JOURNAL = (
    [
        "Starting inference-server.service - LLM inference server...",
        "Started inference-server.service - LLM inference server.",
        "UserWarning: python -m sglang.launch_server is still supported, sglang serve is recommended",
    ]
    + [f"[2026-11-29 18:46:{i % 60:02d}] loading step {i:d}" for i in range(120)]
    + TRACEBACK
    + [
        "inference-server.service: Main process exited, code=exited, status=1/FAILURE",
        "inference-server.service: Failed with result 'exit-code'.",
    ]
)


def refused_url() -> str:
    return f"http://127.0.0.1:{free_port():d}"


def test_unit_failing_while_loading_fails_at_once_with_the_whole_traceback(fake_systemd):
    fake_systemd.set_journal("inv-one", JOURNAL)
    later(
        1.0,
        fake_systemd.set_state,
        ActiveState="failed",
        SubState="failed",
        Result="exit-code",
        ExecMainCode=1,
        ExecMainStatus=1,
        MainPID=0,
    )
    report, took = timed(llm_gate.run_gate, base_options(refused_url(), unit="inference-server", ready_timeout_s=60))
    assert not report["passed"]
    assert took < 4, "the gate must fail within seconds, not at the 60 s deadline"
    assert report["phase"] == "loading"
    reason = report["reasons"][0]
    assert reason.startswith(
        "unit inference-server.service failed (failed/failed, result exit-code, main process exited with status 1)"
    )
    assert "while the server was loading" in reason
    assert reason.endswith(
        "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not "
        "compatible with radix cache when using --mamba-scheduler-strategy no_buffer."
    )
    ev = report["evidence"]
    # the whole start: first line to the last, traceback included, not a fixed tail
    assert ev["log"].splitlines() == JOURNAL
    assert ev["log_capped"] is False and ev["log_lines"] == len(JOURNAL)
    assert ev["state"]["Result"] == "exit-code"
    journal_calls = [c for c in fake_systemd.calls() if c.startswith("journalctl")]
    assert "_SYSTEMD_INVOCATION_ID=inv-one" in journal_calls[0]
    assert "INVOCATION_ID=inv-one" in journal_calls[0].split(" + ")[1]
    message = llm_gate.failure_message(report)
    assert message.splitlines()[0].startswith("gate FAIL (loading): unit inference-server.service failed")
    assert "Traceback (most recent call last):" in message
    assert f"--- journalctl _SYSTEMD_INVOCATION_ID=inv-one ({len(JOURNAL):d} lines) ---" in message


def test_a_restart_by_systemd_fails_and_quotes_the_crashed_start(fake_systemd):
    fake_systemd.set_journal("inv-one", ["Started x.", "RuntimeError: NCCL error", "Main process exited"])
    fake_systemd.set_journal("inv-two", ["Started x again."])
    later(0.8, fake_systemd.set_state, NRestarts=1, InvocationID="inv-two")
    report, took = timed(llm_gate.run_gate, base_options(refused_url(), unit="inference-server.service"))
    assert not report["passed"] and took < 4
    assert "restarted during the gate (NRestarts 0 -> 1" in report["reasons"][0]
    assert report["evidence"]["exception"] == "RuntimeError: NCCL error"
    assert "Started x again." not in report["evidence"]["log"]


def test_a_manual_restart_changes_the_invocation_and_fails(fake_systemd):
    later(0.8, fake_systemd.set_state, InvocationID="inv-two")
    report = llm_gate.run_gate(base_options(refused_url(), unit="inference-server"))
    assert "was restarted during the gate (new invocation inv-two" in report["reasons"][0]


def test_auto_restart_state_is_a_failure(fake_systemd):
    later(
        0.6,
        fake_systemd.set_state,
        ActiveState="activating",
        SubState="auto-restart",
        Result="signal",
        ExecMainCode=2,
        ExecMainStatus=9,
    )
    report = llm_gate.run_gate(base_options(refused_url(), unit="inference-server"))
    assert "exited and waits to be restarted" in report["reasons"][0]
    assert "main process killed by SIGKILL" in report["reasons"][0]


def test_a_unit_that_exits_cleanly_is_a_failure_too(fake_systemd):
    later(0.6, fake_systemd.set_state, ActiveState="inactive", SubState="dead", ExecMainCode=1, ExecMainStatus=0)
    report = llm_gate.run_gate(base_options(refused_url(), unit="inference-server"))
    assert "is not running (inactive/dead" in report["reasons"][0]


def test_a_unit_already_failed_fails_before_any_request(fake_systemd, fake_server):
    server = fake_server()
    fake_systemd.set_state(
        ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode=1, ExecMainStatus=1
    )
    fake_systemd.set_journal("inv-one", ["boom", "OSError: weights missing"])
    report = llm_gate.run_gate(base_options(server.url, unit="inference-server"))
    assert not report["passed"] and report["phase"] == "watch"
    assert report["evidence"]["exception"] == "OSError: weights missing"
    assert server.requests == []


def test_earlier_crash_restarts_fail_unless_allowed(fake_systemd, fake_server):
    server = fake_server()
    fake_systemd.set_state(NRestarts=2)
    report = llm_gate.run_gate(base_options(server.url, unit="inference-server"))
    assert not report["passed"]
    assert "restarted 2 time(s) by systemd since it was last started on purpose" in report["reasons"][0]
    allowed = llm_gate.run_gate(base_options(server.url, unit="inference-server", allow_prior_restarts=True))
    assert allowed["passed"], allowed["reasons"]
    assert allowed["unit"]["NRestarts"] == "2"


def test_unit_dying_mid_measurement_fails_at_once(fake_systemd, fake_server):
    # each request takes about 2 s; the unit fails 1.5 s into the measurement
    server = fake_server(chat={"mode": "ok", "chunks": 41, "ttft": 0.1, "gap": 0.05})
    fake_systemd.set_journal("inv-one", ["serving", "torch.OutOfMemoryError: CUDA out of memory."])
    later(
        1.5,
        fake_systemd.set_state,
        ActiveState="failed",
        SubState="failed",
        Result="oom-kill",
        ExecMainCode=2,
        ExecMainStatus=9,
    )
    report, took = timed(
        llm_gate.run_gate,
        base_options(server.url, unit="inference-server", warmup_requests=0, requests=5, request_timeout_s=30),
    )
    assert not report["passed"] and report["phase"] == "measure"
    assert took < 4
    assert "failed (failed/failed, result oom-kill" in report["reasons"][0]
    assert report["reasons"][0].endswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_a_long_journal_is_capped_and_says_so(fake_systemd):
    lines = [f"noise {i:d}" for i in range(5000)] + TRACEBACK
    fake_systemd.set_journal("inv-one", lines)
    later(
        0.5,
        fake_systemd.set_state,
        ActiveState="failed",
        SubState="failed",
        Result="exit-code",
        ExecMainCode=1,
        ExecMainStatus=1,
    )
    report = llm_gate.run_gate(base_options(refused_url(), unit="inference-server", journal_max_lines=200))
    ev = report["evidence"]
    assert ev["log_capped"] is True and ev["log_lines"] == 200
    assert ev["log"].splitlines() == lines[-200:]
    assert "capped to the last 200 lines" in llm_gate.failure_message(report)
    assert any(c.startswith("journalctl") and " -n 201 " in c for c in fake_systemd.calls())


def test_the_api_key_never_leaks_through_the_journal(fake_systemd):
    fake_systemd.set_journal("inv-one", ["server_args=ServerArgs(api_key='sk-live-123', tp_size=2)", "ValueError: bad"])
    later(0.5, fake_systemd.set_state, ActiveState="failed", SubState="failed")
    report = llm_gate.run_gate(base_options(refused_url(), unit="inference-server", api_key="sk-live-123"))
    assert "sk-live-123" not in str(report)
    assert "api_key='***'" in report["evidence"]["log"]


def test_pid_watch_fails_at_once_when_the_process_dies(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("loading\nTraceback (most recent call last):\n  File x\nKeyError: 'layers'\n")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        later(1.0, proc.kill)  # our child stays a zombie until waited: the watcher must see it as dead
        report, took = timed(
            llm_gate.run_gate, base_options(refused_url(), pid=proc.pid, log_file=str(log), ready_timeout_s=60)
        )
    finally:
        proc.kill()
        proc.wait()
    assert not report["passed"] and took < 3
    assert report["reasons"][0].startswith(f"process {proc.pid:d} exited")
    assert report["evidence"]["exception"] == "KeyError: 'layers'"
    assert report["evidence"]["log_source"] == str(log)


def test_missing_systemctl_is_a_clear_failure(tmp_path, monkeypatch, fake_server):
    server = fake_server()
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    report = llm_gate.run_gate(base_options(server.url, unit="inference-server"))
    assert not report["passed"]
    assert "cannot run systemctl to watch inference-server.service" in report["reasons"][0]


def test_watching_costs_little_while_the_server_is_healthy(fake_systemd, fake_server):
    server = fake_server()
    start = time.monotonic()
    report = llm_gate.run_gate(base_options(server.url, unit="inference-server", poll_interval_s=0.2))
    took = time.monotonic() - start
    assert report["passed"], report["reasons"]
    shows = [c for c in fake_systemd.calls() if c.startswith("systemctl show")]
    # baseline + final check + about 5 per second in between
    assert 2 <= len(shows) <= 3 + took * 6
    assert report["unit"]["ActiveState"] == "active"
