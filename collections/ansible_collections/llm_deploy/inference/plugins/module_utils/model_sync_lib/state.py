"""The sha256 cache (by inode, size and mtime), revision manifests and the last model check."""

from __future__ import annotations

import os
import time

from .common import CACHE_VERSION
from .fs import atomic_write, inode_key


class State:
    """sha256 cache (by inode, valid while size and mtime are unchanged) and revision manifests."""

    def __init__(self, state_dir: str, dest: str, writable: bool) -> None:
        """Load the state of ``dest`` from ``state_dir`` (a fresh one if missing or of another version)."""
        import marshal

        self.dest = os.path.abspath(dest)
        key = self.dest.replace("%", "%25").replace("/", "%2F")
        # marshal, not JSON: loading it costs microseconds and no imports (no-op runs).
        self.path = os.path.join(state_dir, f"{key}.state")
        self.writable = writable
        self.dirty = False
        self.data: dict = {"version": CACHE_VERSION, "dest": self.dest, "inodes": {}, "revisions": {}, "models": {}}
        try:
            with open(self.path, "rb") as fh:
                loaded = marshal.load(fh)
            if isinstance(loaded, dict) and loaded.get("version") == CACHE_VERSION:
                self.data = loaded
        except (FileNotFoundError, ValueError, EOFError, TypeError):
            pass

    def lookup(self, st: os.stat_result) -> str | None:
        """Cached sha256 of the inode, if its size and mtime are unchanged."""
        hit = self.data["inodes"].get(inode_key(st))
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        return None

    def stale(self, st: os.stat_result) -> str | None:
        """Cached sha256 recorded for the same inode, size and mtime (for full verification)."""
        return self.lookup(st)

    def store(self, st: os.stat_result, digest: str) -> None:
        """Remember the sha256 of an inode with its size and mtime."""
        self.data["inodes"][inode_key(st)] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True

    def revision(self, label: str) -> dict | None:
        """Recorded manifest of a revision."""
        return self.data["revisions"].get(label)

    def record_revision(self, label: str, files: dict[str, list], source: str) -> None:
        """Record a verified revision's manifest."""
        old = self.data["revisions"].get(label, {})
        if old.get("files") == files and old.get("source") == source:
            return  # a no-op run writes nothing
        self.data["revisions"][label] = {"files": files, "source": source, "created": old.get("created", time.time())}
        self.dirty = True

    def forget_revision(self, label: str) -> None:
        """Drop a pruned revision."""
        if self.data["revisions"].pop(label, None) is not None:
            self.dirty = True

    def gc(self, live: set[str]) -> None:
        """Forget inodes no longer present under ``dest``."""
        inodes = self.data["inodes"]
        for key in [k for k in inodes if k not in live]:
            del inodes[key]
            self.dirty = True

    def save(self) -> None:
        """Write the state if it changed and writing is allowed."""
        if self.dirty and self.writable:
            import marshal

            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
            atomic_write(self.path, marshal.dumps(self.data))
            self.dirty = False

    def model_check(self, fingerprint: tuple) -> dict | None:
        """Result of an earlier :func:`~.checks.check_model` for the same files (paths, inodes, sizes, mtimes)."""
        hit = self.data["models"].get("last")
        return hit[1] if hit and hit[0] == fingerprint else None

    def store_model_check(self, fingerprint: tuple, result: dict) -> None:
        """Remember a :func:`~.checks.check_model` result."""
        self.data["models"]["last"] = (fingerprint, result)
        self.dirty = True
