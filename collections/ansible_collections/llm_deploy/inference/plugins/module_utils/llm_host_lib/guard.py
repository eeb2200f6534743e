"""``port-guard PORT UNIT [GRACE_S]``: the unit's port guard (role inference_server).

inference_server installs role llm_host's launcher ``files/llm-host`` as
``/usr/local/lib/<unit>/port-guard`` and, beside it at this package's import name, the modules of this
package the guard needs (written by the module's ``install``); the unit runs it as
``ExecStartPre=+`` (as root, the ``+`` prefix), and by that name the launcher runs this guard
(``llm-host guard PORT UNIT [GRACE_S]`` is the same). Who listens on TCP PORT (IPv4 or IPv6)?

* nobody: exit 0;
* a process left over in UNIT's own control group from an earlier run (systemd logs "Found
  left-over process ... in control group while starting unit" and starts the new one next to
  it; SGLang's tokenizer and scheduler workers can survive like that, sgl-project/sglang
  #15165, #23627): it belongs to this unit, so it is stopped (SIGTERM, then SIGKILL after
  GRACE_S seconds, default 10), said on stdout, and the start goes on once the port is free;
* any other process: one sentence naming it (pid, command line, its systemd unit or "not a
  systemd service", user) on stderr, and exit 1, so the unit fails at once with the reason in
  its journal instead of the engine dying on "address already in use" after loading.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from .proc import command, holders, listening, stat_fields, unit_of, user_of

OK = 0
HELD = 1
USAGE = 2


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def stop(pids: list[int], grace_s: float) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL whatever is left (SIGCONT wakes stopped ones)."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def guard(port: int, unit: str, grace_s: float) -> int:
    """Free the port from left-overs of ``unit``; refuse any other holder. Returns the exit status."""
    service = unit if unit.endswith(".service") else unit + ".service"
    me = os.getpid()
    for _ in range(3):
        inodes = listening(port)
        if not inodes:
            return OK
        pids = [p for p in holders(inodes) if p != me]
        ours = [p for p in pids if unit_of(p) == service]
        foreign = [p for p in pids if p not in ours]
        if foreign or not pids:
            if foreign:
                pid = foreign[0]
                where = unit_of(pid)
                who = (
                    f"pid {pid} ({command(pid)[:200]}, {'unit ' + where if where else 'not a systemd service'}, "
                    f"user {user_of(next(iter(inodes.values())))})"
                )
            else:
                who = f"a process of user {user_of(next(iter(inodes.values())))} whose pid is hidden"
            print(
                f"port-guard: port {port} is already taken by {who}, which is not part of {service}, so "
                f"{service} will not start: stop that process or set inference_server_port to a free port.",
                file=sys.stderr,
            )
            return HELD
        for pid in ours:
            print(
                f"port-guard: port {port} is held by pid {pid} ({command(pid)[:200]}), a process left over in "
                f"{service} from an earlier run: stopping it."
            )
        stop(ours, grace_s)
        time.sleep(0.2)
    print(
        f"port-guard: port {port} is still taken after stopping the left-over processes of {service}; "
        "look at `ss -ltnp` on the host.",
        file=sys.stderr,
    )
    return HELD


def guard_main(argv: list[str]) -> int:
    """``PORT UNIT [GRACE_S]``: the exit status of :func:`guard`, 2 on a usage error."""
    if len(argv) not in (2, 3) or not argv[0].isdigit():
        print("usage: port-guard PORT UNIT [GRACE_S]", file=sys.stderr)
        return USAGE
    return guard(int(argv[0]), argv[1], float(argv[2]) if len(argv) == 3 else 10.0)
