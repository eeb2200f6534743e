#!/usr/bin/python3
"""The deploy's one helper on the host: who listens on a TCP port, read from /proc (no ss or lsof).

Standard library only, run with the host's python3. One file, three uses: the Ansible module
``llm_host`` (role llm_host, a dependency of preflight, adopt and inference_server; each
subcommand below is its ``command``, the rest of the command line its ``args``, the JSON its
``host`` result), the same subcommands on a command line (``llm_host.py SUBCOMMAND ...``, for
the tests and by hand), and the unit's port guard (installed by inference_server). Subcommands:

``facts PORT [STATE_FILE] [--path PATH]...`` (preflight: the host facts a deploy checks before it
changes anything)
    Prints one JSON object:

    * ``glibc``: the C library version (``os.confstr``), e.g. ``"2.36"``;
    * ``gpus``: ``[{"index", "name", "memory_mib"}]`` from ``nvidia-smi`` (``[]`` without it);
    * ``gpu_error``: why nvidia-smi gave nothing, when it exists but fails;
    * ``gpu_device_nodes``: ``[{"path", "access"}]``, the NVIDIA device nodes and who may open
      them (``"0666 root:root"``), ``[]`` without a driver;
    * ``port``: ``{"listening", "pid", "command", "unit"}``: who listens on PORT, and the
      systemd service unit whose cgroup holds that process (``/proc`` only, no ss/lsof);
    * ``deployed``: the JSON content of STATE_FILE (the last-known-good record of a previous
      deploy), or ``{}`` when there is none;
    * ``systemd``: whether the host was booted with systemd (``/run/systemd/system`` exists,
      the test of ``sd_booted(3)``);
    * ``paths``: for each ``--path``, what is there (not followed): ``absent``, ``link``,
      ``dir`` or ``file``.

``inspect``, ``record``, ``restore``, ``switch``, ``alive`` (adopt: find, record, stop and
measure-free switch of a server that was started by hand; each prints one JSON object)
    ``inspect PORT UNIT``
        The process listening on PORT outside the systemd unit UNIT: its main process (the
        top-most ancestor that holds the listening socket too), argv, working directory, user and
        group, where its stdout and stderr go, the venv it runs from (``<venv>/bin/...`` in its
        argv with a ``pyvenv.cfg``), the model directory (the first argument that is a directory
        holding ``config.json``) and the *names* of its environment variables. Values never
        leave the host: ``env_masked`` shows the non-secret ones and ``***`` for the names that
        look like secrets (token, key, secret, password, credential, auth).
    ``record PORT UNIT DIR``
        Keep what it takes to start that server again in DIR: ``by-hand.json`` and its
        environment (less what systemd sets per unit) in ``by-hand.env`` (0600), in systemd's
        EnvironmentFile syntax. Prints the masked view.
    ``restore DIR UNIT VENV_LINK``
        Put the hand-built venv back and start the server again, if it is gone, under the
        transient unit UNIT (systemd-run) with its own argv, environment, directory and user.
    ``switch PID START PORT TIMEOUT [--move SRC DEST] [--link LINK TARGET]``
        SIGTERM to the main process, wait up to TIMEOUT s for it and its children to exit and
        the port to be free (in-flight requests finish), SIGKILL what is left; then move the
        hand-built venv aside and point the link at our venv, in one round trip so the gap is
        as short as the engine's start allows.
    ``alive PID START``
        Whether that very process (pid and start time) still runs.

    START is the process's start time in clock ticks since boot (``/proc/<pid>/stat`` field
    22), so a reused pid is never mistaken for the server.

``guard PORT UNIT [GRACE_S]`` (inference_server: installed as ``/usr/local/lib/<unit>/port-guard``,
which runs it as ``port-guard PORT UNIT [GRACE_S]``, the unit's ``ExecStartPre=+``)
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

    Runs as root (the ``+`` prefix).
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_host
short_description: Read the server's host in one round trip; find, keep, stop or restore a server started by hand
description:
  - Runs one subcommand of the deploy's host helper and returns its JSON object as C(host).
  - C(facts) (role preflight) reads glibc, the GPUs, who listens on the server's port, the
    last-known-good record and what is at given paths.
  - C(inspect), C(record), C(restore), C(switch) and C(alive) (role adopt) find a server started
    by hand, keep what it takes to start it again, put it back, stop it and switch the venv link,
    or tell whether it still runs. Secret-looking values never leave the host (masked as ***).
  - Standard library only, run by the host's python3; the same file is the unit's port guard
    (C(port-guard PORT UNIT [GRACE_S])).
options:
  command:
    description: The subcommand.
    type: str
    required: true
    choices: [facts, inspect, record, restore, switch, alive]
  args:
    description: The subcommand's arguments, as on its command line (the file's docstring lists them).
    type: list
    elements: str
    default: []
notes:
  - Check mode runs C(facts), C(inspect) and C(alive) (they change nothing) and skips the others,
    returning C(changed=true) and an empty C(host).
author: llm-deploy
"""

EXAMPLES = r"""
- name: Read the host facts of a deploy
  llm_host:
    command: facts
    args: ["8000", /var/lib/inference-server/deployed.json, --path, /opt/ml-env]
  register: host_facts

- name: Find the server that runs by hand on port 8000
  llm_host:
    command: inspect
    args: ["8000", inference-server]
  register: by_hand
"""

RETURN = r"""
host:
  description: The subcommand's JSON object (see the file's docstring for each subcommand's keys).
  returned: success
  type: dict
"""


import grp
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable

# --------------------------------------------------------------------------------------
# Who listens on a port: /proc/net/tcp and tcp6, socket inodes, the processes holding them
# --------------------------------------------------------------------------------------


def listening(port: int) -> dict[str, int]:
    """Socket inode -> owner uid of the TCP sockets in LISTEN state on ``port`` (IPv4 and IPv6)."""
    found: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    local, state, uid, inode = fields[1], fields[3], fields[7], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        found[inode] = int(uid)
        except FileNotFoundError:
            continue
    return found


def holds(pid: int | str, inodes: Iterable[str]) -> bool:
    """Whether ``pid`` has one of the socket ``inodes`` open.

    Reading another user's file descriptors needs CAP_SYS_PTRACE (root on a normal host has
    it); without it the process is not seen as holding the socket.
    """
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def holders(inodes: Iterable[str]) -> list[int]:
    """Every process that has one of the sockets open, by pid."""
    inodes = list(inodes)
    if not inodes:
        return []
    return sorted(int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if holds(pid, inodes))


def cmdline(pid: int) -> str:
    """The command line of a process, its arguments joined by spaces (OSError when it is gone)."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()


def command(pid: int) -> str:
    """The command line of a process ("?" when it is gone or has none)."""
    try:
        return cmdline(pid) or "?"
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


def group_of(gid: int) -> str:
    """A group name for a gid."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [state, ppid, ...]."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return handle.read().rsplit(")", 1)[1].split()


# --------------------------------------------------------------------------------------
# facts: what a deploy checks before it changes anything (preflight)
# --------------------------------------------------------------------------------------


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

    parser = argparse.ArgumentParser(prog="llm_host.py facts")
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
    }


# --------------------------------------------------------------------------------------
# inspect, record, restore, switch, alive: a server started by hand (adopt)
# --------------------------------------------------------------------------------------

SECRET_NAME = re.compile(r"(?i)(token|secret|passw|key|credential|auth|cookie|session)")
# Set by systemd for each unit (or by a login): restoring them would lie about the new unit.
UNIT_ENV = {
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "NOTIFY_SOCKET",
    "MANAGERPID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
    "MAINPID",
    "MEMORY_PRESSURE_WATCH",
    "MEMORY_PRESSURE_WRITE",
    "CREDENTIALS_DIRECTORY",
    "RUNTIME_DIRECTORY",
    "STATE_DIRECTORY",
    "CACHE_DIRECTORY",
    "LOGS_DIRECTORY",
}


def listener(port: int) -> int | None:
    """The pid of the first process holding a listening socket on ``port``."""
    found = holders(listening(port))
    return found[0] if found else None


def start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot."""
    return int(stat_fields(pid)[19])


def same_process(pid: int, start: int) -> bool:
    """Whether ``pid`` still is the process that started at ``start`` (and is not a zombie)."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return False
    return int(fields[19]) == start and fields[0] not in ("Z", "X")


def exe(pid: int) -> str:
    """The executable of ``pid`` ('' when unreadable)."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def main_process(pid: int, port: int) -> int:
    """The top-most ancestor of ``pid`` that holds the listening socket too (a pre-fork server's
    master), else ``pid`` itself: the process a graceful stop signals."""
    inodes = listening(port)
    current = pid
    while True:
        try:
            parent = int(stat_fields(current)[1])
        except OSError:
            return current
        if parent <= 1 or not holds(parent, inodes):
            return current
        current = parent


def argv_of(pid: int) -> list[str]:
    """The process's argv."""
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        raw = handle.read()
    return [part.decode(errors="surrogateescape") for part in raw.split(b"\0")[:-1]]


def environ_of(pid: int) -> dict[str, str]:
    """The process's environment as it was at exec, less what systemd sets per unit."""
    with open(f"/proc/{pid}/environ", "rb") as handle:
        raw = handle.read()
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode(errors="surrogateescape").partition("=")
        if sep and name and name not in UNIT_ENV:
            env[name] = value
    return env


def output_of(pid: int, fd: int) -> str | None:
    """Where fd 1 or 2 goes when it is a regular file (a log), else None."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    target = target.removesuffix(" (deleted)")
    return target if target.startswith("/") and os.path.isfile(target) else None


def venv_of(argv: list[str], cwd: str) -> str | None:
    """The venv the process runs from: ``<venv>/bin/<x>`` among its first arguments."""
    for arg in argv[:2]:
        path = os.path.normpath(os.path.join(cwd, arg)) if "/" in arg else ""
        if path and os.path.basename(os.path.dirname(path)) == "bin":
            venv = os.path.dirname(os.path.dirname(path))
            if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
                return venv
    return None


def model_of(argv: list[str], cwd: str) -> str | None:
    """The first argument (or --flag=value) naming a directory that holds config.json."""
    for arg in argv[1:]:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        path = os.path.normpath(os.path.join(cwd, value))
        if value and os.path.isfile(os.path.join(path, "config.json")):
            return path
    return None


def inspect(port: int, unit: str) -> dict[str, object]:
    """Describe the server by hand on ``port`` (``found`` false when none or ours)."""
    pid = listener(port)
    if pid is None:
        return {"found": False, "listening": bool(listening(port)), "reason": "no process found"}
    owner_unit = unit_of(pid)
    if owner_unit == f"{unit}.service":
        return {"found": False, "listening": True, "reason": f"held by {owner_unit}", "unit": owner_unit}
    main = main_process(pid, port)
    st = os.stat(f"/proc/{main}")
    argv = argv_of(main)
    cwd = os.readlink(f"/proc/{main}/cwd")
    env = environ_of(main)
    user = user_of(st.st_uid)
    group = group_of(st.st_gid)
    return {
        "found": True,
        "listening": True,
        "port": port,
        "pid": main,
        "listener_pid": pid,
        "start_ticks": start_ticks(main),
        "exe": exe(main),
        "argv": argv,
        "cwd": cwd,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "user": user,
        "group": group,
        "unit": owner_unit,
        "stdout": output_of(main, 1),
        "stderr": output_of(main, 2),
        "venv": venv_of(argv, cwd),
        "model_dir": model_of(argv, cwd),
        "env": env,
    }


def env_file_line(name: str, value: str) -> str:
    """``NAME="value"`` as systemd's EnvironmentFile parser reads it back."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'{name}="{escaped}"'


def mask_argv(argv: list[str]) -> list[str]:
    """The argv with the values of flags that look like secrets (--api-key X, --token=X) as ***."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append("***")
            hide_next = False
        elif arg.startswith("-") and SECRET_NAME.search(arg.split("=", 1)[0]):
            if "=" in arg:
                shown.append(arg.split("=", 1)[0] + "=***")
            else:
                shown.append(arg)
                hide_next = True
        else:
            shown.append(arg)
    return shown


def masked(found: dict[str, object]) -> dict[str, object]:
    """What may leave the host: no environment values that look secret, no secret flag values."""
    view = dict(found)
    env = view.pop("env", None) or {}
    if "argv" in view:
        view["argv"] = mask_argv(view["argv"])  # type: ignore[arg-type]
    view["env_names"] = sorted(env)
    view["env_masked"] = {k: ("***" if SECRET_NAME.search(k) else v) for k, v in sorted(env.items())}
    view["secret_env_names"] = sorted(k for k in env if SECRET_NAME.search(k))
    return view


def _write(path: str, text: str) -> bool:
    """Write ``text`` to ``path`` (0600) unless it is already there; whether it changed."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            if handle.read() == text:
                return False
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
        handle.write(text)
    os.replace(tmp, path)
    return True


def record(port: int, unit: str, directory: str) -> dict[str, object]:
    """Keep what it takes to start the server by hand again: by-hand.json and by-hand.env (0600)."""
    found = inspect(port, unit)
    if not found.get("found"):
        raise SystemExit(
            json.dumps({"failed": True, "msg": f"no server by hand on port {port}: {found.get('reason')}"})
        )
    env = found.pop("env")  # type: ignore[misc]
    kept = {k: v for k, v in env.items() if "\n" not in v and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)}
    state = dict(found, env_names=sorted(kept), env_skipped=sorted(set(env) - set(kept)))
    changed = _write(
        os.path.join(directory, "by-hand.env"), "".join(env_file_line(k, v) + "\n" for k, v in sorted(kept.items()))
    )
    changed = _write(os.path.join(directory, "by-hand.json"), json.dumps(state, indent=2) + "\n") or changed
    return dict(masked(dict(found, env=env)), changed=changed)


def restore(directory: str, unit: str, venv_link: str) -> dict[str, object]:
    """Put the hand-built venv back at its path and start the server by hand again, if it is gone.

    The server runs under the transient unit ``unit`` (systemd-run), with its own argv,
    environment (EnvironmentFile, 0600), working directory, user, group and log files, so
    that it outlives the play and is watched by systemd.
    """
    with open(os.path.join(directory, "by-hand.json"), encoding="utf-8") as handle:
        state = json.load(handle)
    done: dict[str, object] = {"changed": False}
    venv, kept = state.get("venv"), state.get("venv_kept")
    if venv and kept and os.path.isdir(kept) and (os.path.islink(venv) or not os.path.lexists(venv)):
        if os.path.islink(venv):
            os.unlink(venv)
        os.rename(kept, venv)
        done.update(changed=True, venv_restored=venv)
    elif venv_link and venv_link == venv and os.path.islink(venv_link):
        raise SystemExit(
            json.dumps({"failed": True, "msg": f"{venv} is a link and the hand-built venv is not at {kept}"})
        )
    if same_process(int(state["pid"]), int(state["start_ticks"])):
        done.update(started=False, pid=state["pid"], argv=mask_argv(state["argv"]), unit=state.get("unit"))
        return done
    import subprocess

    subprocess.run(["systemctl", "reset-failed", f"{unit}.service"], capture_output=True, check=False)
    argv = [
        "systemd-run",
        f"--unit={unit}",
        "--collect",
        "--quiet",
        "--service-type=simple",
        f"--uid={state['uid']}",
        f"--gid={state['gid']}",
        f"--working-directory={state['cwd']}",
        f"--property=EnvironmentFile={os.path.join(directory, 'by-hand.env')}",
        f"--description=LLM server started by hand, restored by llm-deploy (port {state['port']})",
    ]
    for fd, key in ((1, "stdout"), (2, "stderr")):
        if state.get(key):
            argv.append(f"--property=Standard{'Output' if fd == 1 else 'Error'}=append:{state[key]}")
    run = subprocess.run(argv + ["--"] + state["argv"], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise SystemExit(json.dumps({"failed": True, "msg": f"systemd-run failed: {run.stderr.strip()}"}))
    show = subprocess.run(
        ["systemctl", "show", "-p", "MainPID", "--value", f"{unit}.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    pid = int(show.stdout.strip() or 0)
    started_argv: list[str] = []
    for _ in range(40):  # systemd-run returns after the fork; the exec follows at once
        try:
            started_argv = argv_of(pid) if pid else []
        except OSError:
            break
        if started_argv == state["argv"]:
            break
        time.sleep(0.05)
    done.update(
        changed=True,
        started=True,
        pid=pid,
        unit=f"{unit}.service",
        same_argv=started_argv == state["argv"],
        argv=mask_argv(started_argv),
    )
    return done


def descendants(pid: int) -> list[int]:
    """Every process whose ancestry leads to ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            children.setdefault(int(stat_fields(int(entry))[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def switch(
    state_file: str, pid: int, start: int, port: int, timeout: float, move: list[str] | None, link: list[str] | None
) -> dict[str, object]:
    """Stop the server gracefully (bounded), then move its venv aside and link ours.

    Where the venv went is written into ``state_file`` (by-hand.json) before it moves, so a
    restore finds it whatever happens next.
    """
    began = time.monotonic()
    killed = False
    if same_process(pid, start):
        family = []
        for child in descendants(pid):
            try:
                family.append((child, start_ticks(child)))
            except OSError:
                continue
        os.kill(pid, signal.SIGTERM)
        deadline = began + timeout
        # In-flight requests finish, then the main process exits, its workers follow and the
        # port is free; whatever is still there at the deadline is killed.
        while time.monotonic() < deadline:
            alive = [p for p, ticks in [(pid, start)] + family if same_process(p, ticks)]
            if not alive and not listening(port):
                break
            time.sleep(0.05)
        for child, ticks in [(pid, start)] + family:
            if same_process(child, ticks):
                killed = True
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        while listening(port) and time.monotonic() < deadline + 10:
            time.sleep(0.05)
    stopped = time.monotonic() - began
    if move:
        with open(state_file, encoding="utf-8") as handle:
            state = json.load(handle)
        state["venv_kept"] = move[1]
        _write(state_file, json.dumps(state, indent=2) + "\n")
        os.rename(move[0], move[1])
    if link:
        tmp = link[0] + ".adopt-tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(link[1], tmp)
        os.replace(tmp, link[0])
    return {
        "changed": True,
        "stopped_after_s": round(stopped, 3),
        "killed": killed,
        "port_free": not listening(port),
        "moved": move,
        "linked": link,
    }


def adopt_main(argv: list[str]) -> int:
    """``inspect``, ``record``, ``restore``, ``switch`` and ``alive`` (``argv`` starts with the subcommand)."""
    result = adopt(argv)
    if result is None:
        print(__doc__, file=sys.stderr)
        return USAGE
    print(json.dumps(result))
    return 0


def adopt(argv: list[str]) -> dict[str, object] | None:
    """What ``adopt_main`` prints for ``argv``, or None for a usage error."""
    if len(argv) == 3 and argv[0] == "inspect":
        return masked(inspect(int(argv[1]), argv[2]))
    if len(argv) == 4 and argv[0] == "record":
        return record(int(argv[1]), argv[2], argv[3])
    if len(argv) == 4 and argv[0] == "restore":
        return restore(argv[1], argv[2], argv[3])
    if len(argv) >= 6 and argv[0] == "switch":
        rest = argv[6:]
        move = link = None
        while rest:
            if rest[0] == "--move" and len(rest) >= 3:
                move, rest = rest[1:3], rest[3:]
            elif rest[0] == "--link" and len(rest) >= 3:
                link, rest = rest[1:3], rest[3:]
            else:
                return None
        return switch(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), float(argv[5]), move, link)
    if len(argv) == 3 and argv[0] == "alive":
        return {"alive": same_process(int(argv[1]), int(argv[2]))}
    return None


# --------------------------------------------------------------------------------------
# guard: the unit's port guard (ExecStartPre=+ of inference_server)
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------

# The name the unit runs this file by (inference_server installs it as .../port-guard).
GUARD_NAME = "port-guard"


def main(argv: list[str]) -> int:
    """Run the subcommand in ``argv[1]`` (or the guard, when this file runs as ``port-guard``)."""
    if os.path.basename(argv[0]) == GUARD_NAME:
        return guard_main(argv[1:])
    command_name, rest = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if command_name == "facts":
        return facts_main(rest)
    if command_name == "guard":
        return guard_main(rest)
    return adopt_main(argv[1:])


# --------------------------------------------------------------------------------------
# The Ansible module
# --------------------------------------------------------------------------------------

# The subcommands that change the host (skipped in check mode).
CHANGING = ("record", "restore", "switch")


def run_module() -> None:
    """The module: run ``command`` with ``args`` and return its JSON object as ``host``."""
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec={
            "command": {"type": "str", "required": True, "choices": ["facts", "inspect", *CHANGING, "alive"]},
            "args": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    command, args = module.params["command"], module.params["args"]
    if module.check_mode and command in CHANGING:
        module.exit_json(changed=True, host={})
    try:
        host = facts(args) if command == "facts" else adopt([command, *args])
    except SystemExit as exc:  # a refusal ({"failed": true, "msg": ...}) or argparse's usage error
        refusal = f"exit {exc.code}"
        if isinstance(exc.code, str):
            refusal = json.loads(exc.code).get("msg", exc.code) if exc.code.startswith("{") else exc.code
        module.fail_json(msg=f"llm_host {command} {' '.join(args)}: {refusal}")
    if host is None:
        module.fail_json(msg=f"llm_host {command}: wrong arguments {args} (the module's documentation lists them)")
    module.exit_json(changed=bool(host.get("changed", command in CHANGING)), host=host)


if __name__ == "__main__":
    # A command line (a subcommand, or the port guard's name) runs as a script; Ansible runs the
    # module with no arguments.
    if len(sys.argv) > 1 or os.path.basename(sys.argv[0]) == GUARD_NAME:
        sys.exit(main(sys.argv))
    run_module()
