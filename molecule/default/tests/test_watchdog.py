"""testinfra: the watchdog between deploys, the OnFailure= recorder and the unit's boot ordering.

Runs after test_drain.py (name order): it restarts the server. The watchdog is run once by
hand (`systemctl start inference-server-watchdog.service`, what its timer does) with a short
deadline from /run/inference-server-watchdog.env: first on the healthy server, then on a
server whose main process is stopped (SIGSTOP, a hang); then the unit is put in a crash loop
(a runtime drop-in whose ExecStartPre fails, RestartSec=1) until systemd gives up, and the
watchdog brings it back. The seconds each part takes are printed (the scenario's added time).
"""

from __future__ import annotations

import re
import time

UNIT = "inference-server"
PORT = 8000
PROM = "/var/lib/node_exporter/textfile_collector/llm_watchdog.prom"
ENV_FILE = f"/run/{UNIT}-watchdog.env"
CRASH_DROPIN = f"/run/systemd/system/{UNIT}.service.d/crash-loop.conf"


def metric(host, name: str) -> float:
    """The value of ``name`` in the watchdog's textfile."""
    text = host.file(PROM).content_string
    match = re.search(rf'^{name}{{unit="{UNIT}"}} (\S+)$', text, re.M)
    assert match, text
    return float(match.group(1))


def show(host, *props: str) -> dict[str, str]:
    """Properties of the server's unit, as systemctl show prints them."""
    out = host.run(f"systemctl show {' '.join('-p ' + p for p in props)} {UNIT}.service").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def generates(host) -> bool:
    """True when the server answers one streamed generation of the model it serves."""
    model = host.file("/srv/models/tiny-qwen3.5/current").linked_to
    body = f'{{"model": "{model}", "max_tokens": 2, "stream": true, "messages": [{{"role": "user", "content": "Hi"}}]}}'
    run = host.run(
        f"curl -sS -m 60 -H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:{PORT}/v1/chat/completions"
    )
    return run.rc == 0 and '"choices"' in run.stdout


def run_watchdog(host, **env: str) -> tuple[float, str]:
    """Run the watchdog's service once with ``env`` overrides; its seconds and its journal lines."""
    host.run(f"printf '%s\\n' {' '.join(f'{k}={v}' for k, v in env.items())} > {ENV_FILE}")
    started = time.monotonic()
    try:
        run = host.run(f"systemctl start {UNIT}-watchdog.service")
    finally:
        host.run(f"rm -f {ENV_FILE}")
    took = time.monotonic() - started
    invocation = host.run(f"systemctl show -p InvocationID --value {UNIT}-watchdog.service").stdout.strip()
    journal = host.run(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --no-pager -o cat").stdout
    assert run.rc == 0, run.stderr + journal
    return took, journal


def test_the_unit_waits_for_its_mounts_and_records_a_give_up(host):
    shown = show(host, "RequiresMountsFor", "OnFailure", "StartLimitBurst", "StartLimitIntervalUSec", "Restart")
    mounts = shown["RequiresMountsFor"].split()
    assert "/opt/ml-env" in mounts and host.file("/opt/ml-env").linked_to in mounts
    assert host.file("/srv/models/tiny-qwen3.5/current").linked_to in mounts
    assert shown["OnFailure"] == f"{UNIT}-gave-up.service"
    assert (shown["Restart"], shown["StartLimitBurst"], shown["StartLimitIntervalUSec"]) == ("on-failure", "3", "10min")
    # The CPU rehearsal engine: no NVIDIA unit to wait for (ct129's render asserts it for SGLang).
    assert "nvidia-persistenced" not in host.file(f"/etc/systemd/system/{UNIT}.service").content_string


def test_the_watchdog_timer_is_armed(host):
    timer = host.service(f"{UNIT}-watchdog.timer")
    assert timer.is_enabled and timer.is_running
    out = host.run(f"systemctl show -p NextElapseUSecMonotonic --value {UNIT}-watchdog.timer").stdout.strip()
    assert out not in ("", "infinity", "0"), out


def test_the_watchdog_leaves_a_healthy_server_alone(host):
    pid = show(host, "MainPID")["MainPID"]
    took, journal = run_watchdog(host)
    print(f"watchdog on a healthy server: {took:.1f} s")
    assert "healthy: /health and one generation" in journal, journal
    assert show(host, "MainPID")["MainPID"] == pid
    assert metric(host, "llm_watchdog_probe_success") == 1
    assert 0 < metric(host, "llm_watchdog_probe_latency_seconds") < 30
    assert abs(metric(host, "llm_watchdog_last_probe_timestamp_seconds") - time.time()) < 120


def test_the_watchdog_restarts_a_hung_server_through_the_drain(host):
    before = show(host, "MainPID", "InvocationID")
    restarts = metric(host, "llm_watchdog_restarts_total")
    host.run(f"kill -STOP {before['MainPID']}")
    try:
        took, journal = run_watchdog(host, LLM_WATCHDOG_DEADLINE_S="3", LLM_WATCHDOG_FAILURES="1")
    finally:
        host.run(f"kill -CONT {before['MainPID']}")
    print(f"watchdog on a hung server (probe, drain, start until ready): {took:.1f} s")
    assert "does not answer: restarting it" in journal, journal
    assert f"{UNIT}.service is active after the watchdog's restart" in journal, journal
    after = show(host, "MainPID", "InvocationID", "ActiveState")
    assert after["ActiveState"] == "active"
    assert after["MainPID"] != before["MainPID"] and after["InvocationID"] != before["InvocationID"]
    assert generates(host)
    assert metric(host, "llm_watchdog_restarts_total") == restarts + 1
    assert metric(host, "llm_watchdog_probe_success") == 0


def test_a_crash_loop_is_recorded_and_the_watchdog_brings_the_server_back(host):
    gave_up = metric(host, "llm_server_gave_up_total")
    host.run(f"mkdir -p {CRASH_DROPIN.rsplit('/', 1)[0]}")
    crash = "[Service]\\nExecStartPre=/bin/false\\nRestartSec=1\\n"
    host.run(f"printf '{crash}' > {CRASH_DROPIN} && systemctl daemon-reload")
    started = time.monotonic()
    try:
        host.run(f"systemctl reset-failed {UNIT} && systemctl restart --no-block {UNIT}")
        while show(host, "ActiveState")["ActiveState"] != "failed" and time.monotonic() - started < 300:
            time.sleep(0.5)
        # systemd 252 keeps the result of the last failed start (exit-code) when the start limit ends the restarts.
        state = show(host, "ActiveState", "Result")
        assert state["ActiveState"] == "failed" and state["Result"] in ("exit-code", "start-limit-hit"), state
        while metric(host, "llm_server_gave_up_total") == gave_up and time.monotonic() - started < 330:
            time.sleep(0.5)
    finally:
        host.run(f"rm -f {CRASH_DROPIN} && systemctl daemon-reload")
    crash_loop = time.monotonic() - started
    assert metric(host, "llm_server_gave_up_total") == gave_up + 1
    recorded = host.run(f"journalctl -u {UNIT}-gave-up --no-pager -o cat").stdout
    assert "systemd gave up" in recorded, recorded
    # Not yet due: the first retry waits inference_server_watchdog_retry_failed_s (120 s).
    _, journal = run_watchdog(host)
    assert re.search(r"gave up \d+ s ago .*; retry in \d+ s", journal), journal
    assert show(host, "ActiveState")["ActiveState"] == "failed"
    took, journal = run_watchdog(host, LLM_WATCHDOG_RETRY_FAILED_S="0")
    print(f"crash loop until systemd gave up: {crash_loop:.1f} s; the watchdog's start until ready: {took:.1f} s")
    assert f"{UNIT}.service is active after the retry" in journal, journal
    assert show(host, "ActiveState")["ActiveState"] == "active"
    assert generates(host)
