"""``facts PORT [STATE_FILE] [--path PATH]...``: the host facts a deploy checks before it changes anything.

Role preflight reads them in one round trip (the module's ``command: facts``). One JSON object:

* ``glibc``: the C library version (``os.confstr``), e.g. ``"2.36"``;
* ``gpus``: ``[{"index", "name", "memory_mib"}]`` from ``nvidia-smi`` (``[]`` without it);
* ``gpu_error``: why nvidia-smi gave nothing, when it exists but fails;
* ``gpu_device_nodes``: ``[{"path", "access"}]``, the NVIDIA device nodes and who may open
  them (``"0666 root:root"``), ``[]`` without a driver;
* ``port``: ``{"listening", "pid", "command", "user", "unit"}``: who listens on PORT, and the
  systemd service unit whose cgroup holds that process (``/proc`` only, no ss/lsof);
* ``deployed``: the JSON content of STATE_FILE (the last-known-good record of a previous
  deploy), or ``{}`` when there is none;
* ``systemd``: whether the host was booted with systemd (``/run/systemd/system`` exists,
  the test of ``sd_booted(3)``);
* ``paths``: for each ``--path``, what is there (not followed): ``absent``, ``link``,
  ``dir`` or ``file``;
* ``addresses``: this host's addresses as ``hostname --all-ip-addresses`` lists them (no
  loopback), ``[]`` without that program: the server's IP allow-list lets them in.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

from .proc import cmdline, group_of, holders, listening, unit_of, user_of


def port_owner(port: int) -> dict[str, object]:
    """Who listens on ``port``: pid, command line and systemd unit (None where unknown)."""
    inodes = listening(port)
    pid = cmd = None
    for holder in holders(inodes):
        try:
            pid, cmd = holder, cmdline(holder)
        except OSError:
            continue
        break
    user = user_of(next(iter(inodes.values()))) if inodes else None
    return {"listening": bool(inodes), "pid": pid, "command": cmd, "user": user, "unit": unit_of(pid) if pid else None}


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
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi failed: {exc}"
    if out.returncode != 0:
        return [], f"nvidia-smi exited {out.returncode}: {(out.stderr or out.stdout).strip()}"
    found = []
    for line in out.stdout.strip().splitlines():
        index, name, memory = (part.strip() for part in line.split(","))
        found.append({"index": int(index), "name": name, "memory_mib": int(float(memory))})
    return found, None


# The NVIDIA driver's device nodes: /dev/nvidia0.., nvidiactl, nvidia-uvm, and the MIG capabilities.
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*")


def gpu_device_nodes() -> list[dict[str, str]]:
    """The NVIDIA device nodes with their access, ``[{path, access: "0660 root:video"}]`` by path.

    Who may open them decides the service account's groups (inference_server): a change here
    means the unit may need other groups, so the converged fast path treats it as an input.
    """
    import glob

    found = []
    for path in sorted({p for pattern in GPU_DEVICE_GLOBS for p in glob.glob(pattern)}):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            access = f"{stat.S_IMODE(st.st_mode):04o} {user_of(st.st_uid)}:{group_of(st.st_gid)}"
            found.append({"path": path, "access": access})
    return found


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


def own_addresses() -> list[str]:
    """This host's addresses, as ``hostname --all-ip-addresses`` lists them; ``[]`` when it cannot tell."""
    program = shutil.which("hostname")
    if not program:
        return []
    try:
        out = subprocess.run([program, "--all-ip-addresses"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def path_type(path: str) -> str:
    """What is at ``path``, not following a link: absent, link, dir or file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(mode):
        return "link"
    return "dir" if stat.S_ISDIR(mode) else "file"


def facts_main(argv: list[str]) -> int:
    """``facts PORT [STATE_FILE] [--path PATH]...``: print the host facts as one JSON object."""
    print(json.dumps(facts(argv)))
    return 0


def facts(argv: list[str]) -> dict[str, object]:
    """The host facts for ``PORT [STATE_FILE] [--path PATH]...`` (argparse exits on a usage error)."""
    import argparse

    parser = argparse.ArgumentParser(prog="llm-host facts")
    parser.add_argument("port", type=int)
    parser.add_argument("state_file", nargs="?")
    parser.add_argument("--path", action="append", default=[], help="report what is at PATH (repeatable)")
    args = parser.parse_args(argv)
    found, error = gpus()
    return {
        "glibc": glibc_version(),
        "gpus": found,
        "gpu_error": error,
        "gpu_device_nodes": gpu_device_nodes(),
        "port": port_owner(args.port),
        "deployed": deployed_state(args.state_file),
        "systemd": os.path.isdir("/run/systemd/system"),
        "paths": {path: path_type(path) for path in args.path},
        "addresses": own_addresses(),
    }
