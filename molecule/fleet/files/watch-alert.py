#!/usr/bin/env python3
"""Stop a serving host's server and time the Prometheus alert that follows, then its resolution.

``watch-alert.py --prometheus-host GW --host HOST --alert NAME --out FILE``, on the controller of
molecule/fleet: Prometheus (roles/monitoring, through playbooks/monitoring.yml) runs on the
container GW and answers on its loopback, so every query goes through ``docker exec GW python3``.

1. Wait until every scrape target is up; keep the targets, the gate's series of each host
   (written by health_gate for node_exporter's textfile collector) and the alerts already firing.
2. ``systemctl stop inference-server`` on HOST; time until NAME (for HOST) is pending, then firing.
3. ``systemctl start inference-server`` (it returns once the server answers /health); time until
   NAME is gone.

The figures go to FILE (JSON) for the scenario's verify, and one line to stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.parse
from typing import Any

QUERY = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
GATE_SERIES = ("llm_gate_passed", "llm_gate_decode_tokens_per_second", "llm_gate_last_run_timestamp_seconds")


def docker(container: str, *argv: str) -> str:
    """stdout of ``argv`` run in ``container``; fails loudly."""
    return subprocess.run(["docker", "exec", container, *argv], check=True, capture_output=True, text=True).stdout


class Prometheus:
    """Prometheus's HTTP API on the loopback of a container."""

    def __init__(self, container: str) -> None:
        """Queries go through ``docker exec container``."""
        self.container = container

    def get(self, path: str, **params: str) -> Any:
        """``data`` of an API answer."""
        url = "http://127.0.0.1:9090" + path + ("?" + urllib.parse.urlencode(params) if params else "")
        answer = json.loads(docker(self.container, "python3", "-c", QUERY, url))
        if answer.get("status") != "success":
            raise RuntimeError(f"{path}: {answer}")
        return answer["data"]

    def series(self, name: str) -> dict[str, float]:
        """``host`` label -> value of an instant query of ``name``."""
        return {
            r["metric"].get("host", ""): float(r["value"][1]) for r in self.get("/api/v1/query", query=name)["result"]
        }

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts."""
        return self.get("/api/v1/alerts")["alerts"]


def alert_state(prom: Prometheus, alert: str, host: str) -> str | None:
    """``pending``, ``firing`` or None for ``alert`` on ``host`` (any label value naming it)."""
    for item in prom.alerts():
        labels = item["labels"]
        if labels.get("alertname") == alert and any(host in str(v) for v in labels.values()):
            return item["state"]
    return None


def wait_for(what: str, check: Any, timeout_s: float, interval_s: float = 0.25) -> Any:
    """Poll ``check`` until it returns something true; raise naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def main() -> int:
    """Run the three steps; write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus-host", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--alert", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    prom = Prometheus(args.prometheus_host)
    result: dict[str, Any] = {"alert": args.alert, "host": args.host}

    def all_up() -> list[dict[str, Any]] | None:
        targets = prom.get("/api/v1/targets", state="active")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = wait_for("every scrape target up", all_up, 120, 1.0)
    result["targets"] = [
        {"job": t["labels"].get("job"), "host": t["labels"].get("host"), "health": t["health"]} for t in targets
    ]
    result["gate_series"] = {name: prom.series(name) for name in GATE_SERIES}
    result["rollback_series"] = prom.series("llm_rollback_last_timestamp_seconds")
    result["firing_before"] = sorted(
        {
            f"{a['labels']['alertname']} {a['labels'].get('host', '')}".strip()
            for a in prom.alerts()
            if a["state"] == "firing"
        }
    )
    if alert_state(prom, args.alert, args.host):
        raise RuntimeError(f"{args.alert} is already active for {args.host} before its server stops")

    docker(args.host, "systemctl", "stop", "inference-server")
    stopped = time.monotonic()
    wait_for(f"{args.alert} pending or firing", lambda: alert_state(prom, args.alert, args.host), 120)
    result["pending_after_stop_s"] = round(time.monotonic() - stopped, 2)
    wait_for(f"{args.alert} firing", lambda: alert_state(prom, args.alert, args.host) == "firing", 120)
    result["firing_after_stop_s"] = round(time.monotonic() - stopped, 2)

    docker(args.host, "systemctl", "start", "inference-server")
    answering = time.monotonic()
    wait_for(f"{args.alert} resolved", lambda: alert_state(prom, args.alert, args.host) is None, 180)
    result["resolved_after_start_s"] = round(time.monotonic() - answering, 2)
    result["rule_for"] = next(
        (
            r.get("duration")
            for g in prom.get("/api/v1/rules")["groups"]
            for r in g["rules"]
            if r.get("name") == args.alert
        ),
        None,
    )
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2)
    print(
        f"{args.alert} for {args.host} (for: {result['rule_for']} s): pending {result['pending_after_stop_s']} s and "
        f"firing {result['firing_after_stop_s']} s after its server stopped; resolved "
        f"{result['resolved_after_start_s']} s after it answered again"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
