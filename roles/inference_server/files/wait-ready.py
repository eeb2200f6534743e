#!/usr/bin/python3 -SE
"""Block until an inference server's health URL answers 200 (the unit's ExecStartPost).

``wait-ready URL [INTERVAL_S]``. Connection refused means the engine is still loading
(SGLang opens its HTTP port only after the weights are loaded), 503 means warming up. The
start timeout is systemd's (TimeoutStartSec=): this program waits as long as it is allowed,
but no longer than the server lives: systemd gives ExecStartPost= the server's pid as
$MAINPID, and when that process is gone this exits 1 at once, so a server that dies while
loading fails its start within a poll interval instead of at the start timeout.

It runs as the unit's account, and takes no answer from a process of another one: between the
port guard and the engine's listen (minutes while SGLang loads), any local account can bind the
port, and its 200 would mark the unit started. A listening socket on the URL's port that another
account owns (``/proc/net/tcp``, ``tcp6``) fails the start at once, naming that account. It imports
the package ``llm_host_lib`` installed beside it (python3 -SE: no site directory, no PYTHONPATH).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.proc import listening, user_of


def healthy(url: str) -> bool:
    """True when ``url`` answers HTTP 200 within 30 s."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# Where the kernel lists the sockets; a sandbox without them (ProcSubset=pid) leaves the answer alone to judge.
SOCKET_TABLES = any(os.path.exists(table) for table in ("/proc/net/tcp", "/proc/net/tcp6"))


def port_of(url: str) -> int:
    """The TCP port of ``url``."""
    parts = urllib.parse.urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def accounts(uids: set[int]) -> str:
    """Accounts by name and uid, for a message."""
    return ", ".join(f"{user_of(uid)} (uid {uid})" for uid in sorted(uids))


def alive(pid: int | None) -> bool:
    """True while the process ``pid`` exists (always True when no pid is known)."""
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> int:
    """Poll until healthy, or until the server's main process is gone."""
    if len(sys.argv) not in (2, 3):
        print("usage: wait-ready URL [INTERVAL_S]", file=sys.stderr)
        return 2
    interval = float(sys.argv[2]) if len(sys.argv) == 3 else 1.0
    main_pid = int(os.environ.get("MAINPID") or 0)
    started = time.monotonic()
    port, mine = port_of(sys.argv[1]), os.getuid()
    while True:
        answered = healthy(sys.argv[1])
        # Read after the answer: a process that answered holds the port now, or held it for that answer
        # and closed (then there is no listener of ours yet, and the wait goes on).
        owners = set(listening(port).values()) if SOCKET_TABLES else {mine}
        if owners - {mine}:
            print(
                f"{sys.argv[1]}: port {port} is held by {accounts(owners - {mine})}, not by {accounts({mine})} "
                "that runs the server: another account's process listens where the server will; its answer is "
                "not taken as ready",
                file=sys.stderr,
            )
            return 1
        if answered and owners:
            break
        if not alive(main_pid):
            print(
                f"the server (pid {main_pid}) exited after {time.monotonic() - started:.1f} s before "
                f"{sys.argv[1]} answered",
                file=sys.stderr,
            )
            return 1
        time.sleep(interval)
    print(f"ready after {time.monotonic() - started:.1f} s: {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
