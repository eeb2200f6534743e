"""GPU acceptance on the GPU host: server processes (launch, wait, stop, restart) and JIT caches."""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploytools import build_bundle as bundle

from .common import (
    DEFAULT_JIT_DIRS,
    DROPPED_ENV,
    LOG_MARKERS,
    MULTICAST_OFF,
    OFFLINE_ENV,
    AcceptanceError,
    Plan,
    masked,
    nvidia_smi,
    say,
)
from .device import Device

# --------------------------------------------------------------------------------------
# Processes (device)
# --------------------------------------------------------------------------------------


def base_env() -> dict[str, str]:
    """This machine's environment without the driver's Python settings, offline and with
    NVLink multicast off."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(OFFLINE_ENV)
    env.update(MULTICAST_OFF)
    return env


def server_env(plan: Plan) -> tuple[dict[str, str], dict[str, str]]:
    """The server's environment: the machine's, then the plan's env exactly, then the device's
    allowances (offline variables where the plan has none, multicast forced off).

    Returns the environment and the variables the device added or changed on top of the plan.
    """
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(plan.env)
    added = {k: v for k, v in OFFLINE_ENV.items() if k not in plan.env}
    added.update({k: v for k, v in MULTICAST_OFF.items() if plan.env.get(k) != v})
    env.update(added)
    return env, added


def cache_dirs(env: dict[str, str]) -> list[Path]:
    """Absolute directories named by the plan's cache, workspace and home variables."""
    return [
        Path(v)
        for k, v in sorted(env.items())
        if (re.search(r"CACHE|WORKSPACE", k) or k in ("HOME", "HF_HOME")) and v.startswith("/") and ":" not in v
    ]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on the port."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def session_pids(sid: int) -> list[int]:
    """Processes whose session id is ``sid`` (the server and all it forked)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass(frozen=True)
class ServiceAccount:
    """The account a server runs as (the inference_server role's service user on a deploy)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def ensure(cls, name: str) -> ServiceAccount:
        """The system user ``name`` (created as the role creates it when missing), with the groups of
        the NVIDIA device files it could not open otherwise."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            useradd = ["useradd", "--system", "--user-group", "--home-dir", "/nonexistent"]
            subprocess.run([*useradd, "--shell", "/usr/sbin/nologin", name], check=True)
            say(f"created the system user {name}")
            entry = pwd.getpwnam(name)
        groups = set()
        for device in Path("/dev").glob("nvidia*"):
            info = device.stat()
            if not info.st_mode & 0o006 and info.st_gid != 0:
                groups.add(info.st_gid)
        return cls(name, entry.pw_uid, entry.pw_gid, tuple(sorted(groups)))

    def can_reach(self, paths: list[Path]) -> list[str]:
        """The paths this account cannot read (a directory: list), each with the reason."""
        missing = []
        for path in paths:
            test = ["test", "-r", str(path)] + (["-a", "-x", str(path)] if path.is_dir() else [])
            done = subprocess.run(test, user=self.uid, group=self.gid, extra_groups=list(self.groups), check=False)
            if done.returncode:
                missing.append(f"{path} (not readable by {self.name}; a parent directory may not be traversable)")
        return missing

    def own(self, folder: Path) -> None:
        """Hand a cache folder, and what is in it, to the account."""
        for path in [folder, *folder.rglob("*")]:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(path, self.uid, self.gid)

    def describe(self) -> dict[str, Any]:
        """The account as recorded with the server."""
        return {
            "user": self.name,
            "uid": self.uid,
            "gid": self.gid,
            "groups": [grp.getgrgid(g).gr_name for g in self.groups],
        }


def process_users(pids: list[int]) -> dict[str, int]:
    """How many of ``pids`` run as each user (the real uid of /proc/PID/status)."""
    users: dict[str, int] = {}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            uid_line = next(line for line in status if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        uid = int(uid_line.split()[1])
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        users[name] = users.get(name, 0) + 1
    return users


def start(argv: list[str], env: dict[str, str], log: Path, cwd: Path, account: ServiceAccount | None = None) -> int:
    """Start argv in a new session (setsid), output to ``log``, as ``account`` when given; return its pid."""
    cwd.mkdir(parents=True, exist_ok=True)
    as_account: dict[str, Any] = {}
    if account:
        os.chown(cwd, account.uid, account.gid)
        as_account = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **as_account,
        )
    return proc.pid


def tail(path: Path, lines: int = 60) -> str:
    """The last lines of a text file."""
    if not path.is_file():
        return ""
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 256 * 1024))
        return "\n".join(fh.read().decode(errors="replace").splitlines()[-lines:])


def excerpt(path: Path, limit: int = 80) -> list[str]:
    """Lines of a server log that matter (readiness, JIT, graph capture, memory, errors)."""
    if not path.is_file():
        return []
    picked = [line.rstrip()[:400] for line in path.read_text(errors="replace").splitlines() if LOG_MARKERS.search(line)]
    return picked[: limit // 2] + picked[-limit // 2 :] if len(picked) > limit else picked


def http_json(url: str, body: Any = None, timeout: float = 30) -> Any:
    """GET (or POST ``body``) JSON; return the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode())


def health_status(url: str) -> int | None:
    """HTTP status of GET /health (None when nothing answers)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=25) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


def launch_server(dev: Device, name: str, plan: Plan, user: str | None = None) -> dict[str, Any]:
    """Start ``plan``'s argv with its environment in its own session, as ``user`` when given (the
    service account: created when missing, the plan's cache folders handed to it, HOME its cache);
    record and return the server."""
    if not Path(plan.argv[0]).is_file():
        raise AcceptanceError(f"{plan.argv[0]} does not exist: run install first")
    if port_open(plan.port):
        raise AcceptanceError(f"port {plan.port} is already in use; stop the running server first")
    env, added = server_env(plan)
    account = ServiceAccount.ensure(user) if user else None
    for folder in cache_dirs(plan.env):
        folder.mkdir(parents=True, exist_ok=True)
        if account:
            account.own(folder)
    if account:
        unreachable = account.can_reach([Path(plan.argv[0]).resolve(), plan.venv_dir, plan.model_path / "config.json"])
        if unreachable:
            raise AcceptanceError(f"the service user cannot start the plan: {'; '.join(unreachable)}")
        # No home of its own (as the role's account): the plan's cache folder, which it owns.
        home = plan.env.get("XDG_CACHE_HOME") or str(dev.root / "run")
        env["HOME"], added["HOME"] = home, home
    log = dev.logs / f"server-{name}.log"
    log.unlink(missing_ok=True)
    t0 = time.time()
    pid = start(plan.argv, env, log, dev.root / "run", account)
    record = {
        "pid": pid,
        "t0": t0,
        "log": str(log),
        "argv": plan.argv,
        "plan_env": masked(plan.env),
        "device_env_added": added,
        "url": plan.url,
        "jit_caches_before": jit_cache_sizes(plan.env),
        "account": account.describe() if account else None,
    }
    dev.set_server(name, record)
    say(f"launched '{name}' pid {pid}: {shlex.join(plan.argv)}")
    say(f"plan env: {json.dumps(masked(plan.env))}; device added: {json.dumps(added)}")
    time.sleep(3)
    if not alive(pid):
        print(tail(log))
        raise AcceptanceError(f"server '{name}' exited at once (log above)")
    return record


def cmd_launch(args: argparse.Namespace, dev: Device) -> int:
    """Start the plan's argv (the manifest's, or ``--plan FILE``'s) in its own session."""
    plan = dev.plan(getattr(args, "plan", None))
    launch_server(dev, args.name, plan, getattr(args, "user", None))
    return 0


def cmd_wait(args: argparse.Namespace, dev: Device) -> int:
    """Poll /health until 200 (ready), the server dies (exit 1) or the timeout (exit 2)."""
    record = dev.server(args.name)
    if record.get("ready_s") is not None:
        say(f"'{args.name}' was already ready after {record['ready_s']} s")
        return 0
    log, deadline, last_note = Path(record["log"]), time.time() + args.timeout, 0.0
    while time.time() < deadline:
        status = health_status(record["url"])
        if status == 200:
            record["ready_s"] = round(time.time() - record["t0"], 1)
            # Who runs the server: every process of its session, by its real uid.
            record["process_users"] = process_users(session_pids(record["pid"]))
            dev.set_server(args.name, record)
            say(f"'{args.name}' is ready after {record['ready_s']} s; its processes run as {record['process_users']}")
            return 0
        if not alive(record["pid"]):
            record["died_s"] = round(time.time() - record["t0"], 1)
            dev.set_server(args.name, record)
            print(tail(log, 80))
            say(f"'{args.name}' died after {record['died_s']} s (log tail above)")
            return 1
        if time.time() - last_note >= 30:
            last = tail(log, 1).strip()[:200]
            say(f"waiting for '{args.name}': {time.time() - record['t0']:.0f} s, /health {status}; log: {last}")
            last_note = time.time()
        time.sleep(args.interval)
    say(f"'{args.name}' not ready within this wait ({args.timeout} s); it keeps starting")
    return 2


def stop_session(pid: int, grace_s: float = 60) -> dict[str, Any]:
    """SIGTERM the server's session, SIGKILL what is left after ``grace_s``."""
    t0, forced = time.time(), False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for member in session_pids(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, sig)
        end = time.time() + (grace_s if sig == signal.SIGTERM else 15)
        while session_pids(pid) and time.time() < end:
            time.sleep(0.5)
        if not session_pids(pid):
            break
        forced = True
    return {"stop_s": round(time.time() - t0, 1), "forced": forced, "left": session_pids(pid)}


def gpu_memory_used() -> list[int]:
    """MiB in use per GPU (empty without nvidia-smi)."""
    return [int(x) for x in nvidia_smi("memory.used", "csv,noheader,nounits").split() if x.isdigit()]


def cmd_stop(args: argparse.Namespace, dev: Device) -> int:
    """Stop a server's whole session and wait until its port and the GPUs are free."""
    record = dev.server(args.name)
    result = stop_session(record["pid"])
    end = time.time() + 60
    port = int(record["url"].rsplit(":", 1)[1])
    while time.time() < end and (port_open(port) or any(m > 2048 for m in gpu_memory_used())):
        time.sleep(1)
    result["port_free"] = not port_open(port)
    result["gpu_memory_mib"] = gpu_memory_used()
    record["stop"] = result
    dev.set_server(args.name, record)
    say(
        f"stopped '{args.name}' in {result['stop_s']} s (forced {result['forced']}); port free "
        f"{result['port_free']}; GPU memory {result['gpu_memory_mib']} MiB"
    )
    return 0 if result["port_free"] and not result["left"] else 1


def cmd_restart(args: argparse.Namespace, dev: Device) -> int:
    """Stop OLD, start NEW with the same plan (JIT caches left where the plan puts them), wait."""
    caches = jit_cache_sizes(dev.plan().env)
    dev.update("jit_caches_after_cold", caches)
    say("JIT caches before the restart: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in caches.items() if v))
    if cmd_stop(argparse.Namespace(name=args.old), dev):
        raise AcceptanceError(f"'{args.old}' did not stop cleanly")
    cmd_launch(argparse.Namespace(name=args.new), dev)
    return cmd_wait(argparse.Namespace(name=args.new, timeout=args.timeout, interval=1.0), dev)


def jit_cache_sizes(plan_env: dict[str, str]) -> dict[str, int]:
    """Bytes in the plan's cache folders and in the default JIT cache folders."""
    homes = [os.path.expanduser("~")] + ([plan_env["HOME"]] if plan_env.get("HOME") else [])
    folders = [str(p) for p in cache_dirs(plan_env)]
    folders += [p.replace("~", home, 1) for home in homes for p in DEFAULT_JIT_DIRS]
    return {f: bundle.tree_bytes(Path(f)) if Path(f).is_dir() else 0 for f in dict.fromkeys(folders)}
