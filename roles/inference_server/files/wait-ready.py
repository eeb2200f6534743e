#!/usr/bin/env python3
"""Block until an inference server's health URL answers 200 (the unit's ExecStartPost).

``wait-ready URL [INTERVAL_S]``. Connection refused means the engine is still loading
(SGLang opens its HTTP port only after the weights are loaded), 503 means warming up. The
start timeout is systemd's (TimeoutStartSec=): this program waits as long as it is allowed,
but no longer than the server lives: systemd gives ExecStartPost= the server's pid as
$MAINPID, and when that process is gone this exits 1 at once, so a server that dies while
loading fails its start within a poll interval instead of at the start timeout.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request


def healthy(url: str) -> bool:
    """True when ``url`` answers HTTP 200 within 30 s."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


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
    while not healthy(sys.argv[1]):
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
