"""The engine's configuration, plan and counters; ownership, directories, lock and disk space.

The helpers the fetchers share (what ``.incoming`` lacks, the plan of a fetch, hashing a
file as it lands) live here too, so that each fetcher module holds only its transfer.
"""

from __future__ import annotations

import os
import stat
import time

from .common import INCOMING, LOCK_NAME, REVISIONS, SyncError, gib, ids, now, thread_count
from .fs import scan, start_writeback
from .hashing import Counter, sha256_fd
from .state import State

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO


class EngineBase:
    """One model's settings, plan, counters and state, and the file-system chores around them."""

    def __init__(
        self,
        dest: str,
        *,
        source: dict | None = None,
        revision: str = "",
        state_dir: str = "/var/lib/model-sync",
        owner: str = "root",
        group: str = "root",
        mode: str = "0644",
        dir_mode: str = "0755",
        keep: int = 1,
        protect_paths: list[str] | None = None,
        workers: int = 0,
        verify: str = "cached",
        reserve_mib: int = 1024,
        rsync_opts: list[str] | None = None,
        ssh_opts: list[str] | None = None,
        hub_python: str | None = None,
        hf_token: str | None = None,
        hub_endpoint: str = "",
        refetch: bool = True,
        check: bool = False,
        source_listing: list[dict] | None = None,
        log: Callable[[str], object] | None = None,
    ) -> None:
        """Settings of one model's engine (the module's and the command's options)."""
        self.dest = os.path.abspath(dest)
        self.source = dict(source or {})
        self.revision = revision or ""
        self.state_dir = state_dir
        self.owner, self.group = owner, group
        self.mode, self.dir_mode = int(str(mode), 8), int(str(dir_mode), 8)
        self.keep = keep
        self.protect_paths = list(protect_paths or [])
        self.workers = thread_count(workers)
        self.verify = verify
        self.reserve = reserve_mib << 20
        self.rsync_opts = list(rsync_opts or [])
        self.ssh_opts = list(ssh_opts or [])
        self.hub_python = hub_python
        self.hf_token = hf_token or None
        self.hub_endpoint = hub_endpoint or ""
        self.refetch = refetch
        self.check = check
        self.source_listing = source_listing or []
        self.counter = Counter()
        self.plan: dict = {
            "fetch": [],
            "fetch_bytes": 0,
            "link": [],
            "repair": [],
            "remove": [],
            "switch": None,
            "prune": [],
            "notes": [],
        }
        self.changed = False
        self.timings: dict[str, float] = {}
        self.log = log or (lambda msg: None)
        self.state = State(state_dir, self.dest if dest else "/", writable=not check)
        self._uid_gid: tuple[int, int] | None = None

    # ----- small utilities

    @property
    def incoming(self) -> str:
        """The source snapshot directory."""
        return os.path.join(self.dest, INCOMING)

    @property
    def revisions(self) -> str:
        """Directory of revisions."""
        return os.path.join(self.dest, REVISIONS)

    def uid_gid(self) -> tuple[int, int]:
        """Owner and group ids (resolved once)."""
        if self._uid_gid is None:
            self._uid_gid = ids(self.owner, self.group)
        return self._uid_gid

    def fix_attrs(self, path: str, st: os.stat_result, is_dir: bool = False) -> bool:
        """Set owner, group and mode when they differ; returns whether something changed."""
        uid, gid = self.uid_gid()
        want = self.dir_mode if is_dir else self.mode
        changed = False
        if (st.st_uid, st.st_gid) != (uid, gid):
            if not self.check:
                os.chown(path, uid, gid)
            changed = True
        if stat.S_IMODE(st.st_mode) != want:
            if not self.check:
                os.chmod(path, want)
            changed = True
        return changed

    def fix_tree_attrs(self, root: str, files: dict[str, os.stat_result]) -> int:
        """Normalise owner/mode of ``root``, its sub directories and ``files``; returns changes."""
        n = 0
        dirs = {""}
        for rel in files:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        for d in sorted(dirs):
            p = os.path.join(root, d) if d else root
            if os.path.isdir(p):
                n += self.fix_attrs(p, os.stat(p), is_dir=True)
        for rel, st in files.items():
            n += self.fix_attrs(os.path.join(root, rel), st)
        return n

    def makedirs(self, path: str) -> None:
        """Create a directory (and parents) with the directory mode and owner."""
        if self.check or os.path.isdir(path):
            return
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            self.makedirs(parent)
        os.mkdir(path, self.dir_mode)
        uid, gid = self.uid_gid()
        os.chown(path, uid, gid)
        os.chmod(path, self.dir_mode)

    def lock(self) -> IO[str] | None:
        """Take the per-model lock (one sync at a time); returns the open lock file."""
        import fcntl

        if self.check:
            return None
        self.makedirs(self.dest)
        fh = open(os.path.join(self.dest, LOCK_NAME), "a", encoding="utf-8")
        deadline = time.time() + 3600
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fh
            except BlockingIOError:
                if time.time() > deadline:
                    raise SyncError(
                        f"another model-sync holds {fh.name} for over an hour; check for a stuck run."
                    ) from None
                time.sleep(1)

    def free_bytes(self) -> int:
        """Free bytes for unprivileged use on the file system that holds ``dest``."""
        path = self.dest
        while not os.path.exists(path):
            path = os.path.dirname(path) or "/"
        vfs = os.statvfs(path)
        return vfs.f_bavail * vfs.f_frsize

    def check_space(self, need: int) -> None:
        """Refuse before any byte is copied when ``need`` bytes plus the reserve do not fit."""
        free = self.free_bytes()
        self.plan["free_bytes"] = free
        if need + self.reserve > free:
            raise SyncError(
                f"not enough disk space for {os.path.basename(self.dest)} under {os.path.dirname(self.dest)}: "
                f"the transfer needs {gib(need)} ({need} bytes) plus the {gib(self.reserve)} reserve "
                f"(model_sync_disk_reserve_mib), but only {gib(free)} ({free} bytes) are free; "
                "nothing was copied."
            )

    def stats(self, t0: float) -> dict:
        """Counters and timings."""
        out = {k: int(v) for k, v in self.counter.values.items()}
        out.update({k: round(v, 4) for k, v in self.timings.items()})
        out["seconds"] = round(now() - t0, 4)
        return out

    # ----- what the fetchers share

    def pending_local(self, src_files: dict[str, dict]) -> dict[str, dict]:
        """Files of a listing that .incoming lacks (by size and mtime)."""
        have = scan(self.incoming)
        pending = {}
        for rel, meta in src_files.items():
            st = have.get(rel)
            if (
                st is None
                or st.st_size != meta["size"]
                or (meta.get("mtime_ns") is not None and st.st_mtime_ns != meta["mtime_ns"])
            ):
                pending[rel] = meta
        return pending

    def remove_extra(self, keep: set[str]) -> None:
        """Remove files from .incoming that the source no longer has."""
        for rel in sorted(set(scan(self.incoming)) - keep):
            self.plan["remove"].append(f"{INCOMING}/{rel}")
            if not self.check:
                os.unlink(os.path.join(self.incoming, rel))
                self.changed = True

    def plan_fetch(self, pending: dict[str, dict]) -> None:
        """Record files to fetch in the plan."""
        for rel in sorted(pending):
            self.plan["fetch"].append({"path": rel, "size": pending[rel]["size"]})
        self.plan["fetch_bytes"] = sum(m["size"] for m in pending.values())

    def hash_incoming(self, rel: str) -> None:
        """Hash a file of .incoming into the cache (by inode, size and mtime as read)."""
        path = os.path.join(self.incoming, rel)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            digest = sha256_fd(fd, mapped=True, counter=self.counter)
            after = os.fstat(fd)
            start_writeback(fd)
        finally:
            os.close(fd)
        if (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            self.state.store(st, digest)
