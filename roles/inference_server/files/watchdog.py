#!/usr/bin/env python3
"""The serving host's watchdog between deploys, on the host's own python3 (standard library only).

``watchdog probe CONFIG``: run by <unit>-watchdog.service, which <unit>-watchdog.timer starts.
Skips while a deploy holds the host's deploy lock or the unit is starting or stopping. An
active server is probed: GET /health, then one generation of one token, each with the
deadline. A probe that missed its deadline is told apart from a hang by the engine's own
counters (``metrics_url``, SGLang's /metrics with --enable-metrics): read just before the probe
and again after it, ``sglang:generation_tokens_total`` plus ``sglang:realtime_tokens_total``
grew when the engine generated meanwhile; such a probe is "busy" (the probe waited behind
running requests), not a failure. Without metrics (transformers serve; SGLang without them) a
missed deadline is a failure, as it always was. The running and queued requests are named but
do not decide: a hung scheduler leaves its gauges where they were. After ``failures`` probes in
a row that failed, the server is restarted by the deploy's own restart sequence, role llm_host's
``llm_host_lib/restart.py``, which inference_server installs beside this program (with the port
guard's modules) and which Python finds there (``systemctl restart --no-block``: a drain of the
requests in flight bounded by TimeoutStopSec, then the new start), but without clearing the start
limit: a server that hangs again after each restart reaches it, systemd fails the unit
(OnFailure=) and the back-off below takes over. A unit that systemd gave up on (failed, its start
limit hit) is started again once it has been failed for ``retry_failed_s``, doubled after each
retry that did not bring it back, up to ``retry_failed_max_s``; that start clears the start limit
first (reset-failed), and the back-off is what bounds it.

``watchdog gave-up CONFIG``: the unit's OnFailure= service; writes one line to the journal and
counts the give-up.

Both keep their counters in ``state_file`` (under an flock) and write them, rendered whole, as
node_exporter's textfile ``textfile``: each through a fresh file of a random name in the same
directory, created with O_EXCL|O_NOFOLLOW (a link planted there is never followed), its mode set
on the open file, fsynced and renamed into place. The API key is read from the server's own key
file at each probe and sent only as the Authorization header; it is never printed.
``LLM_WATCHDOG_DEADLINE_S``, ``LLM_WATCHDOG_FAILURES`` and ``LLM_WATCHDOG_RETRY_FAILED_S`` in the
environment override the configuration's (the service reads them from an optional
/run/<unit>-watchdog.env: one probe now with a shorter deadline).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The restart sequence a deploy runs, installed beside this program (/usr/local/lib/<unit>/llm_host_lib).
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.restart import restart, unit_state

# Counters and gauges in the state file, with their HELP text; every one is rendered.
METRICS = {
    "llm_watchdog_last_run_timestamp_seconds": "When the watchdog last ran (probed or skipped).",
    "llm_watchdog_last_probe_timestamp_seconds": "When the server was last probed.",
    "llm_watchdog_probe_latency_seconds": "Seconds the last probe took (/health and one generation).",
    "llm_watchdog_probe_success": "1 when the last probe got /health 200 and a generation within the deadline.",
    "llm_watchdog_consecutive_failures": "Failed probes in a row.",
    "llm_watchdog_probe_busy": "1 when the last probe missed its deadline while the engine generated (not a failure).",
    "llm_watchdog_busy_probes_total": "Probes that missed their deadline while the engine generated (busy, not hung).",
    "llm_watchdog_restarts_total": "Restarts made by the watchdog: of a hung server, or of a unit systemd gave up on.",
    "llm_watchdog_last_restart_timestamp_seconds": "When the watchdog last restarted the server.",
    "llm_server_gave_up_total": "Times systemd gave up restarting the server (its start limit hit; OnFailure=).",
    "llm_server_last_gave_up_timestamp_seconds": "When systemd last gave up restarting the server.",
}


def api_key(path: str) -> str:
    """The server's API key from its key file (``api-key: "<json string>"``); '' when none."""
    if not path or not os.path.exists(path):
        return ""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("api-key:"):
            return str(json.loads(line.split(":", 1)[1].strip()))
    return ""


def timed_out(exc: BaseException) -> bool:
    """Whether a urllib error is a deadline that passed (not a refusal, a reset or an HTTP status)."""
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason)


def probe(config: dict[str, Any], deadline: float) -> tuple[str, bool]:
    """('', False) when /health answers 200 and one generation completes, each within ``deadline``; else
    why not, and whether it was a deadline that passed (the only miss a busy server explains)."""
    try:
        with urllib.request.urlopen(config["health_url"], timeout=deadline) as response:  # noqa: S310 (local URL)
            if response.status != 200:
                return f"/health answered {response.status}", False
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {urllib.parse.urlsplit(exc.url).path}", False
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"no answer within {deadline:g} s ({getattr(exc, 'reason', exc)})", timed_out(exc)
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
    late = f"the generation took longer than {deadline:g} s"
    end = time.monotonic() + deadline
    chunks = 0
    try:
        with urllib.request.urlopen(request, timeout=deadline) as response:  # noqa: S310 (local URL)
            for raw in response:
                line = raw.strip()
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    chunks += bool(json.loads(line[5:]).get("choices"))
                if time.monotonic() > end:
                    return late, True
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {urllib.parse.urlsplit(exc.url).path}", False
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if timed_out(exc):
            return late, True
        return f"no answer within {deadline:g} s ({getattr(exc, 'reason', exc)})", False
    if not chunks:
        return "the generation returned no choices", False
    return "", False


# The engine's counters of generated tokens (their sum grows while it generates) and its request gauges, in
# SGLang's /metrics (0.5.11, 0.5.17: bench/results/sglang-0.5.1*-metrics.txt). realtime_tokens_total grows at
# each log interval of a running request, generation_tokens_total when one ends.
TOKEN_COUNTERS = ("sglang:generation_tokens_total", "sglang:realtime_tokens_total")
REQUEST_GAUGES = {"running": "sglang:num_running_reqs", "queued": "sglang:num_queue_reqs"}
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def engine_progress(config: dict[str, Any], deadline: float) -> dict[str, float] | None:
    """{tokens, running, queued} summed over every series of SGLang's /metrics (all ranks, streaming or
    not), or None when the engine publishes none (no ``metrics_url``, 404, no answer within ``deadline``)."""
    url = config.get("metrics_url") or ""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=deadline) as response:  # noqa: S310 (local URL)
            text = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    totals = {"tokens": 0.0, "running": 0.0, "queued": 0.0}
    names = {**dict.fromkeys(TOKEN_COUNTERS, "tokens"), **{v: k for k, v in REQUEST_GAUGES.items()}}
    found = False
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample and sample.group(1) in names:
            try:
                totals[names[sample.group(1)]] += float(sample.group(3))
            except ValueError:
                continue
            found = True
    return totals if found else None


def busy_verdict(before: dict[str, float] | None, after: dict[str, float] | None) -> tuple[bool, str]:
    """Whether a probe that missed its deadline met a busy engine (its token counters grew between the
    two readings), and the words that say what the counters showed."""
    if before is None or after is None:
        return False, "no engine metrics to tell a busy server from a hung one"
    queue = f"{after['running']:.0f} running, {after['queued']:.0f} queued"
    generated = after["tokens"] - before["tokens"]
    if generated > 0:
        return True, f"the engine generated {generated:.0f} tokens meanwhile ({queue})"
    return False, f"the engine generated no token meanwhile ({queue})"


def deploy_running(config: dict[str, Any], now: float) -> bool:
    """True when a deploy holds the host's deploy lock (a lock older than its stale age does not count)."""
    try:
        age = now - os.stat(config["lock_path"]).st_mtime
    except OSError:
        return False
    stale = float(config.get("lock_stale_after_s", 0))
    return stale <= 0 or age < stale


def restart_unit(config: dict[str, Any], start: bool, clear_start_limit: bool) -> str:
    """Restart (``start``: start) the unit with the deploy's sequence and wait until it started and
    answered its readiness probe or failed: its ActiveState then."""
    done = restart(
        config["unit"],
        float(config["stop_timeout_s"]),
        start=start,
        clear_start_limit=clear_start_limit,
        ready_timeout_s=float(config["start_timeout_s"]),
    )
    return str(done["active_state"])


def render(state: dict[str, Any], unit: str) -> str:
    """The state's metrics as a Prometheus textfile, labelled with the unit."""
    lines = []
    for name, text in METRICS.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines.append(f'{name}{{unit="{unit}"}} {float(state.get(name, 0)):.15g}')
    return "\n".join(lines) + "\n"


def write_replacing(path: Path, text: str, mode: int) -> None:
    """Put ``text`` at ``path`` whole: a fresh file of a random name beside it, created with
    O_EXCL|O_NOFOLLOW (never through a link planted in the directory), its mode set on the open file,
    fsynced, renamed over ``path`` (a link there is replaced, not followed), then the directory fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    while True:
        aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
        try:
            fd = os.open(aside, flags, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(aside, path)
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def publish(config: dict[str, Any], update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``update`` to the state file under its lock; write it and the textfile (write_replacing)."""
    state_path = Path(config["state_file"])
    state_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(f"{state_path}.lock", "a", encoding="utf-8") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            state = {}
        update(state)
        write_replacing(state_path, json.dumps(state, indent=2, sort_keys=True) + "\n", 0o600)
        if config.get("textfile"):
            try:
                write_replacing(Path(config["textfile"]), render(state, config["unit"]), 0o644)
            except OSError as exc:  # node_exporter's directory, not ours: say so and keep probing
                print(f"cannot write the textfile {config['textfile']}: {exc.strerror or exc}", file=sys.stderr)
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
        outcome = restart_unit(config, start=True, clear_start_limit=True)
        publish(config, lambda st: restarted(st, now, "failed_retries", retries + 1 if outcome != "active" else 0))
        print(f"{unit}.service is {outcome} after the retry")
        return 0 if outcome == "active" else 1
    if active != "active":
        publish(config, stamp)
        print(f"skipped: {unit}.service is {active or 'unknown'}")
        return 0

    progress_before = engine_progress(config, deadline)
    started = time.monotonic()
    why, missed_deadline = probe(config, deadline)
    latency = time.monotonic() - started
    busy, counters = False, ""
    if missed_deadline:
        busy, counters = busy_verdict(progress_before, engine_progress(config, deadline) if progress_before else None)

    def probed(st: dict[str, Any]) -> None:
        stamp(st)
        st["llm_watchdog_last_probe_timestamp_seconds"] = now
        st["llm_watchdog_probe_latency_seconds"] = round(latency, 3)
        st["llm_watchdog_probe_success"] = 0 if why else 1
        st["llm_watchdog_probe_busy"] = 1 if busy else 0
        if busy:
            st["llm_watchdog_busy_probes_total"] = int(st.get("llm_watchdog_busy_probes_total", 0)) + 1
        # A busy engine is alive: its progress ends a run of failures as an answer would.
        failed = bool(why) and not busy
        in_a_row = int(st.get("llm_watchdog_consecutive_failures", 0))
        st["llm_watchdog_consecutive_failures"] = in_a_row + 1 if failed else 0
        if not failed:
            st["failed_retries"] = 0

    count = publish(config, probed)["llm_watchdog_consecutive_failures"]
    if not why:
        print(f"healthy: /health and one generation in {latency:.2f} s")
        return 0
    if busy:
        print(f"busy: {why} while {counters}: not a failure")
        return 0
    print(f"probe failed ({count} of {failures} in a row): {why}{'; ' + counters if counters else ''}")
    if count < failures:
        return 0
    print(f"{unit}.service does not answer: restarting it (drain up to {config['stop_timeout_s']} s, then start)")
    outcome = restart_unit(config, start=False, clear_start_limit=False)
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
