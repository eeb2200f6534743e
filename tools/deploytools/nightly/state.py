"""What nightly-deploy keeps between runs: the gate history, run dirs and their pruning, the lock."""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .events import (
    iso,
    utc_now,
)

HISTORY_SCHEMA = 1
# Entries kept per host in history.json (about three months of nights).
HISTORY_KEEP = 100
RUN_ID_FORMAT = "%Y%m%dT%H%M%SZ"
RUN_ID_RE = re.compile(r"^(?P<stamp>\d{8}T\d{6}Z)(?:-(?P<seq>\d+))?$")

# Values of these environment variables stay readable in artifacts/<ident>/command;
# every other value is replaced by REDACTED.
ENV_ALLOW = re.compile(
    r"^(PATH|HOME|USER|LOGNAME|SHELL|LANG|LC_[A-Z]+|TZ|PWD|TERM|DEPLOY_CACHE_DIR|PYTHON[A-Z_]*"
    r"|RUNNER_[A-Z_]+|AWX_[A-Z_]+|ANSIBLE_(?!.*(PASS|SECRET|TOKEN|VAULT|KEY_DATA))[A-Z_]+)$"
)
REDACTED = "<redacted>"


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """Write JSON to ``path`` through a temporary file and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, str(path))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# --- History and the drop check -----------------------------------------------------------


def load_history(path: Path) -> dict[str, Any]:
    """The history file, or an empty history when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"schema": HISTORY_SCHEMA, "hosts": {}}
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        return {"schema": HISTORY_SCHEMA, "hosts": {}}
    return data


def last_entry(history: Mapping[str, Any], host: str, baseline_only: bool) -> Mapping[str, Any] | None:
    """The newest entry of ``host`` (only baseline entries when ``baseline_only``)."""
    for entry in reversed(history.get("hosts", {}).get(host, []) or []):
        if isinstance(entry, Mapping) and (entry.get("baseline") or not baseline_only):
            return entry
    return None


def drop_percent(current: float, previous: float) -> float:
    """How many percent ``current`` is below ``previous`` (negative when above)."""
    if previous <= 0:
        return 0.0
    return (previous - current) / previous * 100.0


def check_drop(current: float | None, previous: float | None, max_drop: float) -> tuple[str, float | None]:
    """Verdict of the drop check: (``ok``|``regression``|``no-baseline``|``no-figure``, drop %).

    A figure more than ``max_drop`` percent below the previous one is a regression; exactly
    ``max_drop`` percent below still passes.
    """
    if current is None:
        return "no-figure", None
    if previous is None or previous <= 0:
        return "no-baseline", None
    drop = drop_percent(current, previous)
    return ("regression" if drop > max_drop + 1e-9 else "ok"), round(drop, 2)


def record_history(history: dict[str, Any], host: str, entry: dict[str, Any]) -> None:
    """Append ``entry`` to ``host``'s list and keep the newest ``HISTORY_KEEP``."""
    entries = history.setdefault("hosts", {}).setdefault(host, [])
    entries.append(entry)
    del entries[:-HISTORY_KEEP]
    history["schema"] = HISTORY_SCHEMA


# --- Artifacts: run dirs, pruning, the lock ---------------------------------------------


def run_time(name: str) -> dt.datetime | None:
    """The UTC start time encoded in a run dir's name, or ``None`` for other names."""
    match = RUN_ID_RE.match(name)
    if not match:
        return None
    try:
        return dt.datetime.strptime(match.group("stamp"), RUN_ID_FORMAT).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def new_run_dir(artifacts: Path, started: dt.datetime) -> Path:
    """Create ``<artifacts>/<stamp>`` (``-2``, ``-3``... when taken) with mode 0700."""
    stamp = started.strftime(RUN_ID_FORMAT)
    for seq in range(1, 1000):
        candidate = artifacts / (stamp if seq == 1 else f"{stamp}-{seq:d}")
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory name under {artifacts} for {stamp}")


def prune_runs(
    artifacts: Path, keep_days: float, now: dt.datetime, keep: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """Remove run dirs whose name-encoded start is more than ``keep_days`` days before ``now``.

    Only real directories named like a run (``RUN_ID_RE``) are candidates; files, links,
    other directories and the names in ``keep`` are never touched. ``keep_days <= 0``
    disables pruning. Returns (removed names, error lines).
    """
    removed: list[str] = []
    errors: list[str] = []
    if keep_days <= 0 or not artifacts.is_dir():
        return removed, errors
    cutoff = now - dt.timedelta(days=keep_days)
    keep_set = set(keep)
    for entry in sorted(artifacts.iterdir()):
        started = run_time(entry.name)
        if started is None or entry.name in keep_set or entry.is_symlink() or not entry.is_dir():
            continue
        if started < cutoff:
            try:
                shutil.rmtree(str(entry))
                removed.append(entry.name)
            except OSError as exc:
                errors.append(f"could not prune {entry}: {exc}")
    return removed, errors


class RunLock:
    """An exclusive, non-blocking ``fcntl.flock`` on a lock file, held for the whole run.

    The kernel drops the lock when the process exits, however it exits, so a crashed run
    never leaves a stale lock behind. The file keeps the holder's pid and start time for
    the message a second run prints.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: Any | None = None

    def acquire(self) -> bool:
        """Take the lock; ``False`` when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid={os.getpid():d} started={iso(utc_now())}\n")
        handle.flush()
        self.handle = handle
        return True

    def holder(self) -> str:
        """What the lock file says about its holder (``pid=... started=...``)."""
        try:
            return self.path.read_text(encoding="utf-8").strip() or "holder unknown"
        except OSError:
            return "holder unknown"

    def release(self) -> None:
        """Drop the lock (the file stays)."""
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def redact_command_file(path: Path) -> None:
    """Replace the values of non-allow-listed variables in ansible-runner's ``command`` file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    env = data.get("env") if isinstance(data, dict) else None
    if not isinstance(env, dict):
        return
    data["env"] = {key: (value if ENV_ALLOW.match(str(key)) else REDACTED) for key, value in env.items()}
    write_json_atomic(path, data, mode=0o600)
