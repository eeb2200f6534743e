#!/usr/bin/env python3
"""Read, in one round trip, the host facts a deploy checks before it changes anything.

``host_facts.py PORT [STATE_FILE] [--path PATH]...`` prints one JSON object:

* ``glibc``: the C library version (``os.confstr``), e.g. ``"2.36"``;
* ``gpus``: ``[{"index", "name", "memory_mib"}]`` from ``nvidia-smi`` (``[]`` without it);
* ``gpu_error``: why nvidia-smi gave nothing, when it exists but fails;
* ``port``: ``{"listening", "pid", "command", "unit"}``: who listens on PORT, and the
  systemd service unit whose cgroup holds that process (``/proc`` only, no ss/lsof);
* ``deployed``: the JSON content of STATE_FILE (the last-known-good record of a previous
  deploy), or ``{}`` when there is none;
* ``systemd``: whether the host was booted with systemd (``/run/systemd/system`` exists,
  the test of ``sd_booted(3)``);
* ``paths``: for each ``--path``, what is there (not followed): ``absent``, ``link``,
  ``dir`` or ``file``.

Stdlib only, so it runs with the host's system python3.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys


def listening_inodes(port: int) -> dict[str, int]:
    """Socket inode -> owner uid of TCP sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    local, state, uid, inode = fields[1], fields[3], fields[7], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes[inode] = int(uid)
        except FileNotFoundError:
            continue
    return inodes


def owner_of(inodes: dict[str, int]) -> tuple[int | None, str | None]:
    """The first process holding one of ``inodes``, as (pid, command line).

    Reading another user's file descriptors needs CAP_SYS_PTRACE (root on a normal host
    has it); without it the owner stays unknown and only the socket's user is reported.
    """
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    cmd = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
                return int(pid), cmd
        except OSError:
            continue
    return None, None


def unit_of(pid: int) -> str | None:
    """The systemd service unit whose cgroup holds ``pid``, if any."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            found = re.findall(r"/([^/\n]+\.service)", handle.read())
    except OSError:
        return None
    return found[-1] if found else None


def glibc_version() -> str | None:
    """The glibc version string, e.g. ``"2.36"`` (None on other C libraries)."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    return found.split()[-1] if found.startswith("glibc") else None


def gpus() -> tuple[list[dict[str, object]], str | None]:
    """NVIDIA GPUs as listed by nvidia-smi, and an error text when it exists but fails."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], None
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return [], f"nvidia-smi exited {out.returncode}: {(out.stderr or out.stdout).strip()}"
    found = []
    for line in out.stdout.strip().splitlines():
        index, name, memory = (part.strip() for part in line.split(","))
        found.append({"index": int(index), "name": name, "memory_mib": int(float(memory))})
    return found, None


def port_owner(port: int) -> dict[str, object]:
    """Who listens on ``port``: pid, command line and systemd unit (None where unknown)."""
    inodes = listening_inodes(port)
    pid, cmd = owner_of(inodes) if inodes else (None, None)
    user = None
    if inodes:
        uid = next(iter(inodes.values()))
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    return {"listening": bool(inodes), "pid": pid, "command": cmd, "user": user,
            "unit": unit_of(pid) if pid else None}


def deployed_state(path: str | None) -> dict[str, object]:
    """The last-known-good record of a previous deploy, ``{}`` when absent or unreadable."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def path_type(path: str) -> str:
    """What is at ``path``, not following a link: absent, link, dir or file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file"


def main() -> int:
    """Entry point."""
    import argparse

    parser = argparse.ArgumentParser(prog="host_facts.py")
    parser.add_argument("port", type=int)
    parser.add_argument("state_file", nargs="?")
    parser.add_argument("--path", action="append", default=[], help="report what is at PATH (repeatable)")
    args = parser.parse_args()
    found, error = gpus()
    print(json.dumps({"glibc": glibc_version(), "gpus": found, "gpu_error": error,
                      "port": port_owner(args.port), "deployed": deployed_state(args.state_file),
                      "systemd": os.path.isdir("/run/systemd/system"),
                      "paths": {path: path_type(path) for path in args.path}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
