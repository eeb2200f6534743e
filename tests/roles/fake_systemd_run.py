"""systemd-run and systemctl, as far as llm_host_lib.adopt.restore uses them, for tests/roles/test_adopt_restore.py.

``systemd-run --unit=U --uid=N --gid=N --working-directory=D --property=K=V ... -- CMD...``: like
systemd's service manager, it opens ``StandardOutput=append:PATH`` and ``StandardError=append:PATH``
itself, as root (following links, as PID 1 does), then starts CMD as the uid and gid (setpriv) in D,
with those files as its output; it records the main pid in $FAKE_SYSTEMD_STATE.
``systemctl show -p MainPID --value U`` prints that pid; ``systemctl reset-failed`` does nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def systemd_run(args: list[str]) -> int:
    """Start the command after ``--`` as systemd would start the transient service."""
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    value = {}
    for option in options:
        name, _, val = option.partition("=")
        if name == "--property":
            key, _, val = val.partition("=")
            value[key] = val
        else:
            value[name] = val
    outputs = {}
    for key in ("StandardOutput", "StandardError"):
        if value.get(key, "").startswith("append:"):
            outputs[key] = open(value[key][len("append:") :], "ab")  # noqa: SIM115 - handed to the child
    setpriv = ["setpriv", f"--reuid={value['--uid']}", f"--regid={value['--gid']}", "--clear-groups"]
    proc = subprocess.Popen(
        setpriv + command,
        cwd=value.get("--working-directory"),
        stdin=subprocess.DEVNULL,
        stdout=outputs.get("StandardOutput", subprocess.DEVNULL),
        stderr=outputs.get("StandardError", subprocess.DEVNULL),
        start_new_session=True,
    )
    Path(os.environ["FAKE_SYSTEMD_STATE"]).write_text(json.dumps({"pid": proc.pid}))
    return 0


def systemctl(args: list[str]) -> int:
    """``show -p MainPID --value UNIT`` and ``reset-failed UNIT``."""
    if args[:1] == ["show"]:
        print(json.loads(Path(os.environ["FAKE_SYSTEMD_STATE"]).read_text())["pid"])
    return 0


def main(tool: str) -> int:
    """Play ``tool`` (systemd-run or systemctl) with this process's arguments."""
    return systemd_run(sys.argv[1:]) if tool == "systemd-run" else systemctl(sys.argv[1:])
