"""``restart UNIT STOP_TIMEOUT_S [--start] [--clear-start-limit] [--daemon-reload] [--ready START_TIMEOUT_S]``:
the one restart sequence of the server's unit.

Two callers, one sequence: role inference_server's ``tasks/restart.yml`` (a deploy's restart, a
rollback's) through the module's ``restart`` command, and the watchdog between deploys
(``files/watchdog.py``), which imports this module from beside itself on the host
(``/usr/local/lib/<unit>/llm_host_lib/``, installed with the port guard's modules).

1. Read the InvocationID of the unit's running start ("" when none runs). A unit that crashed and waits
   out RestartSec (sub-state ``auto-restart``) is stopped first: systemd 252 would otherwise let its
   pending restart and this one meet, and the new start would be systemd's, NRestarts=1, which the gate
   reads as a crash since the last deliberate start (a rollback right after a crash during the gate
   was refused for it). Nothing runs in that state, so the stop drains nothing.
2. ``--daemon-reload``: ``systemctl daemon-reload`` (a rollback put the unit file back).
3. ``--clear-start-limit``: ``systemctl reset-failed``. StartLimitBurst counts every start, the
   deliberate ones too, and a unit systemd gave up on refuses starts until then: a deploy clears
   it (a fourth deploy within the start limit's interval would be refused); the watchdog only for
   a unit systemd gave up on, whose retries its back-off bounds (a hung server's restarts must reach
   the limit).
4. ``systemctl restart --no-block`` (``--start``: ``start``). With KillMode=mixed the old server gets
   SIGTERM and finishes its requests in flight, for up to TimeoutStopSec, while the unit is
   "deactivating".
5. Wait, for at most STOP_TIMEOUT_S + 30 s, until the new start: an InvocationID other than the one
   read first (and not "") that is no longer deactivating, or the unit failed (a start the start
   limit refused).
6. ``--ready``: wait, for at most START_TIMEOUT_S + 30 s, until it is no longer "activating" (the
   unit's readiness probe, ExecStartPost, answered or failed). The deploy leaves that to its gate.

Prints one JSON object (the module's ``host``): ``unit``, ``before`` and ``after`` (the
InvocationIDs), ``active_state``, ``started`` (step 5 ended in time), ``changed`` (always true);
when the new start did not come in time, ``failed`` and ``msg``, one sentence.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

from .guard import USAGE

# What the wait adds to the unit's own bounds (TimeoutStopSec, TimeoutStartSec): systemd's own
# steps around them (the stop's SIGKILL and reaping, ExecStartPre).
MARGIN_S = 30.0
PROPERTIES = "ActiveState,SubState,InvocationID,InactiveEnterTimestampMonotonic,Result,NRestarts"


def systemctl(*args: str) -> str:
    """Output of ``systemctl ARGS`` (stdout; its exit status is not checked)."""
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False).stdout


def unit_state(unit: str) -> dict[str, str]:
    """ActiveState, SubState, InvocationID, InactiveEnterTimestampMonotonic, Result and NRestarts of ``unit``."""
    out = systemctl("show", "-p", PROPERTIES, f"{unit}.service")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_state(
    unit: str, done: Callable[[dict[str, str]], bool], timeout: float, interval: float
) -> tuple[bool, dict[str, str]]:
    """Read ``unit``'s state until ``done(state)`` holds (True) or ``timeout`` seconds have passed (False),
    and the last state read."""
    end = time.monotonic() + timeout
    while True:
        state = unit_state(unit)
        if done(state):
            return True, state
        if time.monotonic() > end:
            return False, state
        time.sleep(interval)


def restart(
    unit: str,
    stop_timeout_s: float,
    start: bool = False,
    clear_start_limit: bool = False,
    daemon_reload: bool = False,
    ready_timeout_s: float = 0.0,
    interval: float = 1.0,
) -> dict[str, object]:
    """Restart (``start``: start) ``unit`` and wait for its new start, as the module docstring says."""
    now = unit_state(unit)
    before = now.get("InvocationID", "")
    if now.get("SubState") == "auto-restart":
        subprocess.run(["systemctl", "stop", f"{unit}.service"], capture_output=True, check=False)
    if daemon_reload:
        systemctl("daemon-reload")
    if clear_start_limit:
        systemctl("reset-failed", f"{unit}.service")
    systemctl("start" if start else "restart", "--no-block", f"{unit}.service")

    def new_start(now: dict[str, str]) -> bool:
        if now.get("ActiveState") == "failed":  # the start limit refused the start
            return True
        return now.get("InvocationID", "") not in ("", before) and now.get("ActiveState") != "deactivating"

    bound = float(stop_timeout_s) + MARGIN_S
    started, state = wait_state(unit, new_start, bound, interval)
    if started and ready_timeout_s:
        ready_bound = float(ready_timeout_s) + MARGIN_S
        _, state = wait_state(unit, lambda now: now.get("ActiveState") != "activating", ready_bound, interval)
    result: dict[str, object] = {
        "changed": True,
        "unit": unit,
        "before": before,
        "after": state.get("InvocationID", ""),
        "active_state": state.get("ActiveState", "unknown"),
        "started": started,
    }
    if not started:
        result["failed"] = True
        result["msg"] = (
            f"{unit}.service did not start again within {bound:.0f} s of its restart (it is "
            f"{result['active_state']}): the old server's drain outlasted TimeoutStopSec or the new start hangs "
            f"before its first step; look at journalctl -u {unit}.service."
        )
    return result


def parse(argv: list[str]) -> dict[str, object] | None:
    """The keyword arguments of :func:`restart` for ``UNIT STOP_TIMEOUT_S [options]``, or None when wrong."""
    if len(argv) < 2:
        return None
    try:
        kwargs: dict[str, object] = {"unit": argv[0], "stop_timeout_s": float(argv[1])}
        rest = argv[2:]
        while rest:
            flag, rest = rest[0], rest[1:]
            if flag in ("--start", "--clear-start-limit", "--daemon-reload"):
                kwargs[flag[2:].replace("-", "_")] = True
            elif flag == "--ready" and rest:
                kwargs["ready_timeout_s"], rest = float(rest[0]), rest[1:]
            else:
                return None
    except ValueError:
        return None
    return kwargs


def restart_main(argv: list[str]) -> int:
    """``UNIT STOP_TIMEOUT_S [options]``: restart, print the JSON object; 1 when the new start did not come."""
    kwargs = parse(argv)
    if kwargs is None:
        print(__doc__, file=sys.stderr)
        return USAGE
    result = restart(**kwargs)  # type: ignore[arg-type]
    print(json.dumps(result))
    return 1 if result.get("failed") else 0
