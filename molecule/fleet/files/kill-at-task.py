#!/usr/bin/env python3
"""Run a playbook and kill it like a controller crash the moment it starts a given task.

``kill-at-task.py --task TEXT -- ansible-playbook ...``, on the controller of molecule/fleet:
the command runs in its own process group, its output passes through as it comes, and when a
line announces a task whose name contains TEXT (``TASK [role : name] ***``), the whole group
(ansible-playbook, its workers and their ``docker exec`` clients) gets SIGKILL, as when the
controller's machine dies. One line after its output says when: ``kill-at-task: killed ... after N s``.

Exit status: 137 after the kill; the command's own status when no such task started (the
scenario's verify then finds no kill line and fails).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, help="text in the name of the task to kill the run at")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    started = time.monotonic()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if line.startswith("TASK [") and args.task in line:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            task = line.strip().rstrip("*").strip()
            print(f"kill-at-task: killed the run at {task} after {time.monotonic() - started:.1f} s")
            return 128 + signal.SIGKILL
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
