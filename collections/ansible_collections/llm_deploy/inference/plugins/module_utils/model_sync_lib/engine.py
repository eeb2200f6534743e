"""The engine: verification of ``.incoming``, the sync action, verify in place and the actions' dispatch."""

from __future__ import annotations

import os

from .checks import check_model, clean_label, read_manifest_file, revision_label
from .common import INCOMING, MANIFEST_NAME, REVISIONS, SyncError, now
from .fs import scan
from .hashing import hash_many
from .revisions import Revisions

ACTIONS = ("sync", "switch", "prune", "verify", "space")


class Engine(Revisions):
    """Plan, fetch, verify, stage, switch and prune one model's revisions."""

    def run(self, action: str, path: str = "") -> dict:
        """Do one of :data:`ACTIONS` (``verify`` checks ``path``; ``switch`` goes to ``self.revision``)."""
        if action == "sync":
            return self.sync()
        if action == "switch":
            return self.switch(self.revision)
        if action == "prune":
            return self.prune()
        if action == "verify":
            return self.verify_dir(path)
        if action == "space":
            return self.space()
        raise SyncError(f"model_sync action '{action}' is not one of {', '.join(ACTIONS)}.")

    # ----- verification of .incoming

    def hash_tree(self, root: str, files: dict[str, os.stat_result]) -> tuple[dict[str, str], set[str], list[str]]:
        """sha256 of every file (the cache, else hashing); returns hashes, rehashed, rotten.

        Fetchers that hashed bytes on the way put them in the cache under the new inode.

        ``rotten`` are files whose content changed while size and mtime did not (full mode).
        """
        hashes: dict[str, str] = {}
        todo: list[tuple[str, int]] = []
        cached_before: dict[str, str] = {}
        for rel, st in files.items():
            cached = self.state.lookup(st)
            if cached and self.verify != "full":
                hashes[rel] = cached
                continue
            if cached:
                cached_before[rel] = cached
            todo.append((os.path.join(root, rel), st.st_size))
        rehashed = set()
        rotten = []
        if todo:
            prefix = len(root) + 1
            for path, digest in hash_many(todo, self.workers, self.counter).items():
                rel = path[prefix:]
                st = files[rel]
                if os.stat(path).st_mtime_ns == st.st_mtime_ns:
                    self.state.store(st, digest)
                hashes[rel] = digest
                rehashed.add(rel)
                if rel in cached_before and cached_before[rel] != digest:
                    rotten.append(rel)
        return hashes, rehashed, rotten

    def verify_incoming(
        self, expected: dict[str, str]
    ) -> tuple[dict[str, os.stat_result], dict[str, str], set[str], list[str]]:
        """Hash .incoming and compare with the source manifest; returns files, hashes, rehashed, bad."""
        files = scan(self.incoming)
        if MANIFEST_NAME in files:
            expected = {**read_manifest_file(os.path.join(self.incoming, MANIFEST_NAME)), **expected}
        hashes, rehashed, rotten = self.hash_tree(self.incoming, files)
        bad = sorted(set(rotten) | {rel for rel, d in expected.items() if rel in hashes and hashes[rel] != d})
        missing = sorted(rel for rel in expected if rel not in files)
        if missing:
            raise SyncError(
                f"the source lacks {', '.join(missing[:5])}, which its {MANIFEST_NAME} lists; fix the mirror."
            )
        return files, hashes, rehashed, bad

    def checked_model(self, root: str, files: dict[str, os.stat_result], rehashed: set[str], what: str) -> dict:
        """:func:`~.checks.check_model`, skipped when the same inodes, sizes and mtimes passed it before."""
        fingerprint = (root,) + tuple((rel, st.st_ino, st.st_size, st.st_mtime_ns) for rel, st in sorted(files.items()))
        if not rehashed and self.verify != "full":
            hit = self.state.model_check(fingerprint)
            if hit is not None:
                return hit
        model = check_model(root, files, rehashed, what)
        self.state.store_model_check(fingerprint, model)
        return model

    # ----- the sync action

    def sync(self) -> dict:
        """Fetch, verify and stage a revision (does not switch ``current``)."""
        t0 = now()
        lock = self.lock()
        try:
            return self._sync(t0)
        finally:
            self.state.save()
            if lock:
                lock.close()

    def _fetch(self) -> tuple[str, dict[str, str]]:
        """Run the source's fetcher; returns the hub commit and expected sha256 (hub metadata)."""
        kind = self.source.get("type")
        if kind == "mirror" and self.source.get("host"):
            from .fetch_rsync import fetch_ssh

            fetch_ssh(self)
            return "", {}
        if kind == "mirror":
            from .fetch_local import fetch_local

            fetch_local(self)
            return "", {}
        if kind == "hub":
            from .fetch_hub import fetch_hub

            return fetch_hub(self)
        if kind == "controller_dir":
            if self.source_listing:
                listing = {f["path"]: f for f in self.source_listing}
                pending = self.pending_local(listing)
                self.plan_fetch(pending)
            return "", {}
        raise SyncError(f"model_sync_source.type '{kind}' is not one of controller_dir, mirror, hub, host_path.")

    def _sync(self, t0: float) -> dict:
        """Body of :meth:`sync` (lock held)."""
        commit, expected = self._fetch()
        self.timings["fetch_s"] = now() - t0
        if self.check and (self.plan["fetch"] or not os.path.isdir(self.incoming)):
            return self._check_result(commit)
        t1 = now()
        files, hashes, rehashed, bad = self.verify_incoming(expected)
        if bad and self.refetch and self.source.get("type") != "controller_dir" and not self.check:
            self.log(f"sha256 mismatch in {', '.join(bad)}; fetching again")
            for rel in bad:
                os.unlink(os.path.join(self.incoming, rel))
            self.plan["refetched"] = bad
            commit, expected = self._fetch()
            files, hashes, rehashed, bad = self.verify_incoming(expected)
        if bad:
            if self.source.get("type") == "controller_dir" and self.refetch and not self.check:
                for rel in bad:
                    os.unlink(os.path.join(self.incoming, rel))
                return {
                    "changed": True,
                    "refetch": bad,
                    "plan": self.plan,
                    "stats": self.stats(t0),
                    "msg": f"sha256 mismatch in {', '.join(bad)}; "
                    f"removed from {INCOMING} so the next push fetches it again",
                }
            again = " after fetching again" if self.plan.get("refetched") or not self.refetch else ""
            raise SyncError(
                f"sha256 mismatch in {', '.join(bad)}{again}; the source itself is corrupt or its manifest is wrong."
            )
        model = self.checked_model(self.incoming, files, rehashed, f"the source snapshot {self.incoming}")
        self.plan["notes"].extend(model["notes"])
        manifest = {rel: [files[rel].st_size, hashes[rel]] for rel in sorted(files)}
        if "label" not in model:  # content digest, cached with the model check
            model["label"] = revision_label(manifest)
        label = clean_label(
            self.revision or (commit[:12] if commit else "") or str(self.source.get("revision") or "") or model["label"]
        )
        self.timings["verify_s"] = now() - t1
        if not self.check:
            if self.fix_tree_attrs(self.incoming, files):
                self.changed = True
        t2 = now()
        target = self.stage(label, files, hashes)
        self.timings["stage_s"] = now() - t2
        if not self.check:
            self.state.record_revision(label, manifest, self.describe_source())
        current = self.current_target()
        if current != os.path.join(REVISIONS, label):
            self.plan["switch"] = {"from": current, "to": os.path.join(REVISIONS, label)}
        return {
            "changed": self.changed,
            "revision": label,
            "model_dir": target,
            "config": model["config"],
            "weights_bytes": model["weights_bytes"],
            "weights": model["weights"],
            "plan": self.plan,
            "stats": self.stats(t0),
            "refetch": [],
        }

    def _check_result(self, commit: str) -> dict:
        """Check-mode answer when the new content is not on the host yet (label unknown)."""
        label = self.revision or (commit[:12] if commit else "") or str(self.source.get("revision") or "")
        self.plan["switch"] = {
            "from": self.current_target(),
            "to": os.path.join(REVISIONS, label) if label else "a new revision (label derived after transfer)",
        }
        self.changed = True
        return {
            "changed": True,
            "revision": label,
            "model_dir": os.path.join(self.revisions, label) if label else "",
            "config": {},
            "weights_bytes": sum(f["size"] for f in self.plan["fetch"]),
            "weights": [],
            "plan": self.plan,
            "stats": self.stats(now()),
            "refetch": [],
        }

    def describe_source(self) -> str:
        """One-line description of the source (no secrets)."""
        s = self.source
        if s.get("type") == "hub":
            return f"hub:{s.get('repo_id')}@{s.get('revision')}"
        if s.get("host"):
            return f"mirror:{s.get('host')}:{s.get('path')}"
        return f"{s.get('type')}:{s.get('path')}"

    # ----- verify in place (host_path) and the disk check of a push

    def verify_dir(self, path: str) -> dict:
        """Verify a model directory in place: config, index, sizes, sha256 (manifest or cache)."""
        t0 = now()
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            raise SyncError(f"model_sync_source.path {path} is not a directory on the host.")
        files = scan(path)
        expected = read_manifest_file(os.path.join(path, MANIFEST_NAME)) if MANIFEST_NAME in files else {}
        hashes, rehashed, rotten = self.hash_tree(path, files)
        bad = sorted(set(rotten) | {rel for rel, d in expected.items() if rel in hashes and hashes[rel] != d})
        missing = sorted(rel for rel in expected if rel not in files)
        self.state.save()
        if missing:
            raise SyncError(f"{path} lacks {', '.join(missing[:5])}, which its {MANIFEST_NAME} lists.")
        if bad:
            raise SyncError(
                f"sha256 mismatch in {', '.join(bad)} under {path}; "
                "a host_path source is only verified, so replace the file(s) by hand."
            )
        model = self.checked_model(path, files, rehashed, path)
        manifest = {rel: [files[rel].st_size, hashes[rel]] for rel in sorted(files)}
        if "label" not in model:
            model["label"] = revision_label(manifest)
        label = clean_label(self.revision or model["label"])
        return {
            "changed": False,
            "revision": label,
            "model_dir": path,
            "config": model["config"],
            "weights_bytes": model["weights_bytes"],
            "weights": model["weights"],
            "plan": self.plan,
            "stats": self.stats(t0),
        }

    def space(self) -> dict:
        """Disk check for a controller-side push (``source_listing`` against .incoming)."""
        listing = {f["path"]: f for f in self.source_listing}
        pending = self.pending_local(listing)
        self.plan_fetch(pending)
        self.check_space(self.plan["fetch_bytes"])
        return {"changed": False, "plan": self.plan, "stats": self.stats(now())}
