"""``inspect``, ``record``, ``restore``, ``switch``, ``alive``: a server started by hand (role adopt).

Find it, keep what it takes to start it again, stop it and switch the venv link with no
measuring in between, put it back, or tell whether it still runs. Each prints one JSON object
(the module's ``host``):

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
``switch STATE_FILE PID START PORT TIMEOUT [--move SRC DEST] [--link LINK TARGET]``
    SIGTERM to the main process, wait up to TIMEOUT s for it and its children to exit and
    the port to be free (in-flight requests finish), SIGKILL what is left; then move the
    hand-built venv aside (where it went is written into STATE_FILE, ``by-hand.json``, first)
    and point the link at our venv, in one round trip so the gap is as short as the engine's
    start allows.
``alive PID START``
    Whether that very process (pid and start time) still runs.

START is the process's start time in clock ticks since boot (``/proc/<pid>/stat`` field
22), so a reused pid is never mistaken for the server.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from .guard import USAGE
from .proc import SECRET_NAME, group_of, holders, holds, listening, mask_argv, stat_fields, unit_of, user_of

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


def logged_as_the_user(argv: list[str], stdout: str | None, stderr: str | None) -> list[str]:
    """``argv`` with its output appended to the by-hand server's log files, opened by the server's own
    user: a shell that systemd-run starts as that user opens them, then execs the server (its pid and
    argv stay the server's). systemd's ``StandardOutput=append:`` would open them as root, following
    a link the user put there (onto a root-owned file). A file the user cannot open for appending is
    left alone, and the output goes to the journal instead."""
    if stdout and stderr == stdout:
        paths, names, redirect = [stdout], ["f"], '>>"$f" 2>&1'
    elif stdout and stderr:
        paths, names, redirect = [stdout, stderr], ["o", "e"], '>>"$o" 2>>"$e"'
    elif stdout or stderr:
        paths, names, redirect = [stdout or stderr], ["f"], '>>"$f"' if stdout else '2>>"$f"'
    else:
        return list(argv)
    count = len(paths)
    # A subshell: a redirection that fails on ':' (a special built-in) ends the shell that runs it.
    opens = " && ".join(f'( : >>"${n}" ) 2>/dev/null' for n in range(1, count + 1))
    keep = " ".join(f"{name}=${n};" for n, name in enumerate(names, 1))
    script = f'if {opens}; then {keep} shift {count}; exec "$@" {redirect}; fi; shift {count}; exec "$@"'
    return ["/bin/sh", "-c", script, "by-hand-server", *paths, *argv]


def restore(directory: str, unit: str, venv_link: str) -> dict[str, object]:
    """Put the hand-built venv back at its path and start the server by hand again, if it is gone.

    The server runs under the transient unit ``unit`` (systemd-run), with its own argv,
    environment (EnvironmentFile, 0600), working directory, user, group and log files, so
    that it outlives the play and is watched by systemd.
    """
    with open(os.path.join(directory, "by-hand.json"), encoding="utf-8") as handle:
        state = json.load(handle)
    # uid: the account the server runs as, whose listener the gate expects on the port (llm_gate/listener.py).
    done: dict[str, object] = {"changed": False, "uid": state["uid"]}
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
    command = logged_as_the_user(state["argv"], state.get("stdout"), state.get("stderr"))
    run = subprocess.run(argv + ["--"] + command, capture_output=True, text=True, check=False)
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
