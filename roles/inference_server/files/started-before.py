#!/usr/bin/env python3
"""Which of FILES changed after UNIT's running process started? (an interrupted deploy)

``started-before.py UNIT FILE...`` prints one JSON object: ``active`` (the unit runs a main
process), ``started`` (when it started, Unix seconds), ``newer`` (the FILES modified after
that). A deploy restarts the server through a handler after writing its files; a deploy
killed between the two leaves the new files with the old process, which the next run, seeing
no change, would otherwise keep. Standard library only (the host's python3).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main_start(unit: str) -> float | None:
    """Wall-clock start of the unit's main process, None when it runs none."""
    out = subprocess.run(
        ["systemctl", "show", "-p", "MainPID", "-p", "ExecMainStartTimestampMonotonic", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("MainPID", "0") in ("", "0") or not props.get("ExecMainStartTimestampMonotonic", "0").isdigit():
        return None
    monotonic_us = int(props["ExecMainStartTimestampMonotonic"])
    if monotonic_us == 0:
        return None
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC) + monotonic_us / 1e6


def main(argv: list[str]) -> int:
    """Entry point."""
    if len(argv) < 3:
        print("usage: started-before.py UNIT FILE...", file=sys.stderr)
        return 2
    started = main_start(argv[1])
    newer = []
    if started is not None:
        for path in argv[2:]:
            try:
                if os.stat(path).st_mtime > started:
                    newer.append(path)
            except FileNotFoundError:
                continue
    print(json.dumps({"active": started is not None, "started": started, "newer": newer}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
