"""testinfra: the watchdog between deploys, the OnFailure= recorder and the unit's boot ordering.

The watchdog is run once by hand (`systemctl start inference-server-watchdog.service`, what its
timer does) on the healthy server. The faults it handles, a hung server and a crash loop that
systemd gave up on, are rows of docs/reliability.md (molecule/reliability's
tests/test_5_between_deploys.py).
"""

from __future__ import annotations

import re
import time

UNIT = "inference-server"
PORT = 8000
PROM = "/var/lib/node_exporter/textfile_collector/llm_watchdog.prom"
ENV_FILE = f"/run/{UNIT}-watchdog.env"


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
