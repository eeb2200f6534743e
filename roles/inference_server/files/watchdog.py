#!/usr/bin/env python3
"""The serving host's watchdog between deploys, on the host's own python3 (standard library only).

``watchdog probe CONFIG``: run by <unit>-watchdog.service, which <unit>-watchdog.timer starts.
Skips while a deploy holds the host's deploy lock or the unit is starting or stopping. An
active server is probed: GET /health, then one generation of one token, each with the
deadline; after ``failures`` probes in a row that failed, the server is restarted the way a
deploy restarts it (reset-failed, ``systemctl restart --no-block``: a drain of the requests in
flight bounded by TimeoutStopSec, then the new start). A unit that systemd gave up on (failed,
its start limit hit) is started again once it has been failed for ``retry_failed_s``, doubled
after each retry that did not bring it back, up to ``retry_failed_max_s``.

``watchdog gave-up CONFIG``: the unit's OnFailure= service; writes one line to the journal and
counts the give-up.

Both keep their counters in ``state_file`` (under an flock) and write them, rendered whole, as
node_exporter's textfile ``textfile`` (written aside and renamed into place). The API key is
read from the server's own key file at each probe and sent only as the Authorization header;
it is never printed. ``LLM_WATCHDOG_DEADLINE_S``, ``LLM_WATCHDOG_FAILURES`` and
``LLM_WATCHDOG_RETRY_FAILED_S`` in the environment override the configuration's (the service
reads them from an optional /run/<unit>-watchdog.env: one probe now with a shorter deadline).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Counters and gauges in the state file, with their HELP text; every one is rendered.
METRICS = {
    "llm_watchdog_last_run_timestamp_seconds": "When the watchdog last ran (probed or skipped).",
    "llm_watchdog_last_probe_timestamp_seconds": "When the server was last probed.",
    "llm_watchdog_probe_latency_seconds": "Seconds the last probe took (/health and one generation).",
    "llm_watchdog_probe_success": "1 when the last probe got /health 200 and a generation within the deadline.",
    "llm_watchdog_consecutive_failures": "Failed probes in a row.",
    "llm_watchdog_restarts_total": "Restarts made by the watchdog: of a hung server, or of a unit systemd gave up on.",
    "llm_watchdog_last_restart_timestamp_seconds": "When the watchdog last restarted the server.",
    "llm_server_gave_up_total": "Times systemd gave up restarting the server (its start limit hit; OnFailure=).",
    "llm_server_last_gave_up_timestamp_seconds": "When systemd last gave up restarting the server.",
}


def systemctl(*args: str) -> str:
    """Output of ``systemctl ARGS`` (stdout; its exit status is not checked)."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False).stdout


def unit_state(unit: str) -> dict[str, str]:
    """ActiveState, InvocationID and InactiveEnterTimestampMonotonic of ``unit``.service."""
    props = "ActiveState,InvocationID,InactiveEnterTimestampMonotonic,Result,NRestarts"
    out = systemctl("show", "-p", props, f"{unit}.service")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def api_key(path: str) -> str:
    """The server's API key from its key file (``api-key: "<json string>"``); '' when none."""
    if not path or not os.path.exists(path):
        return ""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("api-key:"):
            return str(json.loads(line.split(":", 1)[1].strip()))
    return ""


def probe(config: dict[str, Any], deadline: float) -> str:
    """'' when /health answers 200 and one generation completes, each within ``deadline``; else why not."""
    try:
        with urllib.request.urlopen(config["health_url"], timeout=deadline) as response:  # noqa: S310 (local URL)
            if response.status != 200:
                return f"/health answered {response.status}"
        body = {
            "model": config["model"],
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            # Streamed, as the gate asks: both engines stream; transformers serve may not answer otherwise.
            "stream": True,
        }
        headers = {"Content-Type": "application/json"}
        key = api_key(config.get("api_key_file", ""))
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(config["chat_url"], data=json.dumps(body).encode(), headers=headers)
        end = time.monotonic() + deadline
        chunks = 0
        with urllib.request.urlopen(request, timeout=deadline) as response:  # noqa: S310 (local URL)
            for raw in response:
                line = raw.strip()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    chunks += bool(json.loads(line[5:]).get("choices"))
                if time.monotonic() > end:
                    return f"the generation took longer than {deadline:g} s"
        if not chunks:
            return "the generation returned no choices"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {urllib.parse.urlsplit(exc.url).path}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"no answer within {deadline:g} s ({getattr(exc, 'reason', exc)})"
    return ""


def deploy_running(config: dict[str, Any], now: float) -> bool:
    """True when a deploy holds the host's deploy lock (a lock older than its stale age does not count)."""
    try:
        age = now - os.stat(config["lock_path"]).st_mtime
    except OSError:
        return False
    stale = float(config.get("lock_stale_after_s", 0))
    return stale <= 0 or age < stale


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 1.0) -> bool:
    """Poll ``check`` until it is true (True) or ``timeout`` seconds have passed (False)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(interval)
    return True


def restart(config: dict[str, Any], verb: str) -> str:
    """Restart (or start) the unit as a deploy does and wait for the outcome: its ActiveState then."""
    unit = config["unit"]
    before = unit_state(unit).get("InvocationID", "")
    # The start limit counts deliberate starts too (tasks/service.yml clears it the same way).
    systemctl("reset-failed", f"{unit}.service")
    systemctl(verb, "--no-block", f"{unit}.service")

    def new_start() -> bool:
        state = unit_state(unit)
        return state.get("InvocationID", "") not in ("", before) and state.get("ActiveState") != "deactivating"

    # The drain (KillMode=mixed, TimeoutStopSec), then the start until ready (TimeoutStartSec).
    wait_for(new_start, float(config["stop_timeout_s"]) + 30)
    wait_for(lambda: unit_state(unit).get("ActiveState") != "activating", float(config["start_timeout_s"]) + 30)
    return unit_state(unit).get("ActiveState", "unknown")


def render(state: dict[str, Any], unit: str) -> str:
    """The state's metrics as a Prometheus textfile, labelled with the unit."""
    lines = []
    for name, text in METRICS.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines.append(f'{name}{{unit="{unit}"}} {float(state.get(name, 0)):.15g}')
    return "\n".join(lines) + "\n"


def publish(config: dict[str, Any], update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``update`` to the state file under its lock; write it and the textfile aside, then rename."""
    state_path = Path(config["state_file"])
    state_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(f"{state_path}.lock", "a", encoding="utf-8") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = {}
        update(state)
        targets = [(state_path, json.dumps(state, indent=2, sort_keys=True) + "\n", 0o600)]
        if config.get("textfile"):
            targets.append((Path(config["textfile"]), render(state, config["unit"]), 0o644))
        for path, text, mode in targets:
            path.parent.mkdir(parents=True, exist_ok=True)
            aside = path.with_name(f".{path.name}.{os.getpid()}")
            aside.write_text(text, encoding="utf-8")
            aside.chmod(mode)
            os.replace(aside, path)
    return state


def run_probe(config: dict[str, Any]) -> int:
    """One watchdog run; 0 unless the server could not be brought back."""
    unit, now = config["unit"], time.time()
    deadline = float(os.environ.get("LLM_WATCHDOG_DEADLINE_S") or config["deadline_s"])
    failures = int(os.environ.get("LLM_WATCHDOG_FAILURES") or config["failures"])
    retry_failed = float(os.environ.get("LLM_WATCHDOG_RETRY_FAILED_S") or config["retry_failed_s"])
    state = unit_state(unit)
    active = state.get("ActiveState", "")

    def stamp(st: dict[str, Any]) -> None:
        st["llm_watchdog_last_run_timestamp_seconds"] = now

    if deploy_running(config, now):
        publish(config, stamp)
        print(f"skipped: a deploy holds {config['lock_path']}")
        return 0
    if active == "failed":
        failed_for = time.monotonic() - int(state.get("InactiveEnterTimestampMonotonic") or 0) / 1e6
        retries = int(publish(config, stamp).get("failed_retries", 0))
        wait = min(retry_failed * 2**retries, float(config["retry_failed_max_s"]))
        if failed_for < wait:
            result = state.get("Result")
            print(
                f"{unit}.service gave up {failed_for:.0f} s ago (Result={result}); retry in {wait - failed_for:.0f} s"
            )
            return 0
        print(f"{unit}.service has been failed for {failed_for:.0f} s: starting it again (retry {retries + 1})")
        outcome = restart(config, "start")
        publish(config, lambda st: restarted(st, now, "failed_retries", retries + 1 if outcome != "active" else 0))
        print(f"{unit}.service is {outcome} after the retry")
        return 0 if outcome == "active" else 1
    if active != "active":
        publish(config, stamp)
        print(f"skipped: {unit}.service is {active or 'unknown'}")
        return 0

    started = time.monotonic()
    why = probe(config, deadline)
    latency = time.monotonic() - started

    def probed(st: dict[str, Any]) -> None:
        stamp(st)
        st["llm_watchdog_last_probe_timestamp_seconds"] = now
        st["llm_watchdog_probe_latency_seconds"] = round(latency, 3)
        st["llm_watchdog_probe_success"] = 0 if why else 1
        st["llm_watchdog_consecutive_failures"] = int(st.get("llm_watchdog_consecutive_failures", 0)) + 1 if why else 0
        if not why:
            st["failed_retries"] = 0

    count = publish(config, probed)["llm_watchdog_consecutive_failures"]
    if not why:
        print(f"healthy: /health and one generation in {latency:.2f} s")
        return 0
    print(f"probe failed ({count} of {failures} in a row): {why}")
    if count < failures:
        return 0
    print(f"{unit}.service does not answer: restarting it (drain up to {config['stop_timeout_s']} s, then start)")
    outcome = restart(config, "restart")
    publish(config, lambda st: restarted(st, now, "llm_watchdog_consecutive_failures", 0))
    print(f"{unit}.service is {outcome} after the watchdog's restart")
    return 0 if outcome == "active" else 1


def restarted(state: dict[str, Any], now: float, key: str, value: int) -> None:
    """Count one restart by the watchdog in ``state`` and set ``key`` to ``value``."""
    state["llm_watchdog_restarts_total"] = int(state.get("llm_watchdog_restarts_total", 0)) + 1
    state["llm_watchdog_last_restart_timestamp_seconds"] = now
    state[key] = value


def run_gave_up(config: dict[str, Any]) -> int:
    """OnFailure=: say in the journal that systemd gave up on the unit, and count it."""
    unit, now = config["unit"], time.time()
    state = unit_state(unit)

    def gave_up(st: dict[str, Any]) -> None:
        st["llm_server_gave_up_total"] = int(st.get("llm_server_gave_up_total", 0)) + 1
        st["llm_server_last_gave_up_timestamp_seconds"] = now

    total = publish(config, gave_up)["llm_server_gave_up_total"]
    retry = "the watchdog starts it again" if config.get("watchdog") else "nothing restarts it (watchdog off)"
    print(
        f"{unit}.service failed (Result={state.get('Result', '?')}, {state.get('NRestarts', '?')} automatic "
        f"restarts): systemd gave up (time {total}); {retry} after {config['retry_failed_s']} s, then backs off"
    )
    return 0


def main(argv: list[str]) -> int:
    """``watchdog probe|gave-up CONFIG``."""
    if len(argv) != 2 or argv[0] not in ("probe", "gave-up"):
        print("usage: watchdog probe|gave-up CONFIG", file=sys.stderr)
        return 2
    config = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    return run_probe(config) if argv[0] == "probe" else run_gave_up(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
