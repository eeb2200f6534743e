#!/usr/bin/env python3
"""Make sure the server's port is free before the unit starts its engine (ExecStartPre=+).

``port-guard PORT UNIT [GRACE_S]``: who listens on TCP PORT (IPv4 or IPv6)?

* nobody: exit 0;
* a process left over in UNIT's own control group from an earlier run (systemd logs "Found
  left-over process ... in control group while starting unit" and starts the new one next to
  it; SGLang's tokenizer and scheduler workers can survive like that, sgl-project/sglang
  #15165, #23627): it belongs to this unit, so it is stopped (SIGTERM, then SIGKILL after
  GRACE_S seconds, default 10), said on stdout, and the start goes on once the port is free;
* any other process: one sentence naming it (pid, command line, its systemd unit or "not a
  systemd service", user) on stderr, and exit 1, so the unit fails at once with the reason in
  its journal instead of the engine dying on "address already in use" after loading.

Runs as root (the ``+`` prefix), with the host's python3 and the standard library only;
reads /proc (no ss or lsof).
"""
from __future__ import annotations

import os
import pwd
import re
import signal
import sys
import time
from typing import Iterable

OK, HELD, USAGE = 0, 1, 2


def listening(port: int) -> dict[str, int]:
    """Socket inode -> owner uid of the TCP sockets in LISTEN state on ``port``."""
    found: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        found[fields[9]] = int(fields[7])
        except FileNotFoundError:
            continue
    return found


def holders(inodes: Iterable[str]) -> list[int]:
    """Every process that has one of the sockets open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd")):
                pids.append(int(pid))
        except OSError:
            continue
    return sorted(pids)


def command(pid: int) -> str:
    """The command line of a process ("?" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def unit_of(pid: int) -> str | None:
    """The systemd service unit whose control group holds ``pid`` (None outside any service)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            found = re.findall(r"/([^/\n]+\.service)", handle.read())
    except OSError:
        return None
    return found[-1] if found else None


def user_of(uid: int) -> str:
    """A user name for a uid."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
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
                who = (f"pid {pid} ({command(pid)[:200]}, {'unit ' + where if where else 'not a systemd service'}, "
                       f"user {user_of(next(iter(inodes.values())))})")
            else:
                who = f"a process of user {user_of(next(iter(inodes.values())))} whose pid is hidden"
            print(f"port-guard: port {port} is already taken by {who}, which is not part of {service}, so "
                  f"{service} will not start: stop that process or set inference_server_port to a free port.",
                  file=sys.stderr)
            return HELD
        for pid in ours:
            print(f"port-guard: port {port} is held by pid {pid} ({command(pid)[:200]}), a process left over in "
                  f"{service} from an earlier run: stopping it.")
        stop(ours, grace_s)
        time.sleep(0.2)
    print(f"port-guard: port {port} is still taken after stopping the left-over processes of {service}; "
          "look at `ss -ltnp` on the host.", file=sys.stderr)
    return HELD


def main(argv: list[str]) -> int:
    """Entry point."""
    if len(argv) not in (3, 4) or not argv[1].isdigit():
        print("usage: port-guard PORT UNIT [GRACE_S]", file=sys.stderr)
        return USAGE
    return guard(int(argv[1]), argv[2], float(argv[3]) if len(argv) == 4 else 10.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
