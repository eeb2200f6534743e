#!/usr/bin/env python3
"""Block until an inference server's health URL answers 200 (the unit's ExecStartPost).

``wait-ready URL [INTERVAL_S]``. Connection refused means the engine is still loading
(SGLang opens its HTTP port only after the weights are loaded), 503 means warming up. The
start timeout is systemd's (TimeoutStartSec=): this program waits as long as it is allowed.
"""
from __future__ import annotations

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


def main() -> int:
    """Poll until healthy."""
    if len(sys.argv) not in (2, 3):
        print("usage: wait-ready URL [INTERVAL_S]", file=sys.stderr)
        return 2
    interval = float(sys.argv[2]) if len(sys.argv) == 3 else 1.0
    started = time.monotonic()
    while not healthy(sys.argv[1]):
        time.sleep(interval)
    print(f"ready after {time.monotonic() - started:.1f} s: {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
