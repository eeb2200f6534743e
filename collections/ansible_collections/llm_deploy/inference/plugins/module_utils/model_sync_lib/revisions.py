"""Revisions: staging from hard links, repair of a staged one, the atomic switch and pruning."""

from __future__ import annotations

import os

from .base import EngineBase
from .checks import clean_label
from .common import CURRENT, PARTIAL, REVISIONS, SyncError, now
from .fs import fsync_files, fsync_path, inode_key, link_replace, publish, scan
from .hashing import hash_many


class Revisions(EngineBase):
    """What the engine does under ``dest/revisions`` and with ``dest/current``."""

    def stage(self, label: str, files: dict[str, os.stat_result], hashes: dict[str, str]) -> str:
        """Assemble ``revisions/<label>`` from hard links to .incoming; repair an existing one."""
        target = os.path.join(self.revisions, label)
        if os.path.isdir(target):
            self._repair(target, files, hashes)
            return target
        partial = target + PARTIAL
        self.plan["link"] = sorted(files)
        self.changed = True
        if self.check:
            return target
        self.makedirs(partial)
        t0 = now()
        fsync_files([os.path.join(self.incoming, rel) for rel in sorted(files)], self.workers)
        self.timings["fsync_s"] = now() - t0
        have = scan(partial)
        for rel in sorted(files):
            src = os.path.join(self.incoming, rel)
            dst = os.path.join(partial, rel)
            st = have.get(rel)
            if st is not None and (st.st_dev, st.st_ino) == (files[rel].st_dev, files[rel].st_ino):
                continue
            self.makedirs(os.path.dirname(dst))
            link_replace(src, dst)
        for rel in set(have) - set(files):
            os.unlink(os.path.join(partial, rel))
        self.fix_tree_attrs(partial, {})
        fsync_path(partial)
        publish(partial, target)
        return target

    def _repair(self, target: str, files: dict[str, os.stat_result], hashes: dict[str, str]) -> None:
        """Make an existing revision equal to .incoming; a wrong file is replaced by rename(2)."""
        have = scan(target)
        suspects: list[tuple[str, int]] = []
        for rel, st in files.items():
            tst = have.get(rel)
            if tst is None:
                self.plan["repair"].append({"path": rel, "why": "missing"})
            elif (tst.st_dev, tst.st_ino) == (st.st_dev, st.st_ino):
                continue
            elif tst.st_size != st.st_size:
                self.plan["repair"].append({"path": rel, "why": f"size {tst.st_size} != {st.st_size}"})
            else:
                cached = self.state.lookup(tst)
                if cached is None or self.verify == "full":
                    suspects.append((os.path.join(target, rel), tst.st_size))
                elif cached != hashes[rel]:
                    self.plan["repair"].append({"path": rel, "why": "sha256 mismatch"})
        if suspects:
            prefix = len(target) + 1
            for path, digest in hash_many(suspects, self.workers, self.counter).items():
                rel = path[prefix:]
                self.state.store(have[rel], digest)
                if digest != hashes[rel]:
                    self.plan["repair"].append({"path": rel, "why": "sha256 mismatch"})
        extra = sorted(set(have) - set(files))
        self.plan["remove"].extend(f"{REVISIONS}/{os.path.basename(target)}/{rel}" for rel in extra)
        if not self.plan["repair"] and not extra:
            return
        self.changed = True
        for item in self.plan["repair"]:
            self.log(f"repairing {item['path']} in {target}: {item['why']}")
        if self.check:
            return
        fsync_files([os.path.join(self.incoming, item["path"]) for item in self.plan["repair"]], self.workers)
        for item in self.plan["repair"]:
            dst = os.path.join(target, item["path"])
            self.makedirs(os.path.dirname(dst))
            link_replace(os.path.join(self.incoming, item["path"]), dst)
        for rel in extra:
            os.unlink(os.path.join(target, rel))

    def current_target(self) -> str | None:
        """What ``current`` points at (as stored in the link), or None."""
        try:
            return os.readlink(os.path.join(self.dest, CURRENT))
        except FileNotFoundError:
            return None
        except OSError:
            raise SyncError(
                f"{os.path.join(self.dest, CURRENT)} exists and is not a symlink; "
                "move it away so model_sync can manage it."
            ) from None

    def switch(self, label: str) -> dict:
        """Point ``current`` at ``revisions/<label>`` with rename(2) of a temporary link."""
        label = clean_label(label)
        target = os.path.join(self.revisions, label)
        want = os.path.join(REVISIONS, label)
        have = self.current_target()
        result = {"changed": False, "revision": label, "model_dir": target, "plan": self.plan}
        if have == want:
            return result
        if not os.path.isdir(target) and not self.check:
            raise SyncError(f"revision {label} is not staged under {self.revisions}; run the sync first.")
        self.plan["switch"] = {"from": have, "to": want}
        result["changed"] = True
        if not self.check:
            link = os.path.join(self.dest, CURRENT)
            tmp = os.path.join(self.dest, f".{CURRENT}.tmp.{os.getpid()}")
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(want, tmp)
            publish(tmp, link)
        return result

    def prune(self) -> dict:
        """Remove revisions beyond the newest ``keep`` previous ones; never the current or protected."""
        lock = self.lock()
        try:
            return self._prune()
        finally:
            self.state.save()
            if lock:
                lock.close()

    def _protected(self) -> set[str]:
        """Real paths that no pruned revision may hold: ``current`` and ``protect_paths``."""
        current = self.current_target()
        protected = {os.path.realpath(p) for p in self.protect_paths if p}
        if current:
            protected.add(os.path.realpath(os.path.join(self.dest, current)))
        return protected

    def _prune(self) -> dict:
        """Body of :meth:`prune` (lock held)."""
        protected = self._protected()
        try:
            names = sorted(os.listdir(self.revisions))
        except FileNotFoundError:
            names = []
        revs, partials = [], []
        for name in names:
            path = os.path.join(self.revisions, name)
            if name.startswith(".") or not os.path.isdir(path) or os.path.islink(path):
                continue
            (partials if name.endswith(PARTIAL) else revs).append(name)

        def created(name: str) -> float:
            """When a revision was recorded (else its directory's mtime): newest are kept."""
            rec = self.state.revision(name)
            return rec["created"] if rec else os.stat(os.path.join(self.revisions, name)).st_mtime

        keepers, doomed = [], []
        for name in sorted(revs, key=created, reverse=True):
            path = os.path.realpath(os.path.join(self.revisions, name))
            if any(path == p or p.startswith(path + os.sep) for p in protected):
                continue
            (keepers if len(keepers) < self.keep else doomed).append(name)
        in_progress = {f"{n}" for n in partials if self.revision and n == self.revision + PARTIAL}
        doomed += [n for n in partials if n not in in_progress]
        self.plan["prune"] = [os.path.join(REVISIONS, n) for n in doomed]
        if doomed and not self.check:
            import shutil

            for name in doomed:
                shutil.rmtree(os.path.join(self.revisions, name))
                self.state.forget_revision(name)
            live = set()
            for root in [self.incoming] + [os.path.join(self.revisions, n) for n in os.listdir(self.revisions)]:
                live.update(inode_key(st) for st in scan(root).values())
            self.state.gc(live)
        return {"changed": bool(doomed), "plan": self.plan, "pruned": self.plan["prune"], "kept": keepers}
