"""Fetcher of a mirror directory mounted on the host: kernel copies, hashed as they land."""

from __future__ import annotations

import os

from .common import SyncError
from .fs import copy_file, scan

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from .base import EngineBase


def fetch_local(eng: EngineBase) -> None:
    """Copy a local mirror directory into .incoming (kernel copies, hashed as they land)."""
    src = eng.source["path"]
    if not os.path.isdir(src):
        raise SyncError(f"model_sync_source.path {src} is not a directory on the host.")
    src_files = {rel: {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "st": st} for rel, st in scan(src).items()}
    pending = eng.pending_local(src_files)
    need = sum(m["size"] for m in pending.values())
    eng.plan_fetch(pending)
    eng.check_space(need)
    eng.remove_extra(set(src_files))
    if eng.check or not pending:
        return
    eng.makedirs(eng.incoming)
    for rel in pending:
        eng.makedirs(os.path.dirname(os.path.join(eng.incoming, rel)))
    from concurrent.futures import ThreadPoolExecutor

    # A pipeline: the kernel copies file i while threads hash the copies already made
    # (their pages are still in the cache), so verification of what was written costs
    # no second pass over the disk and overlaps the copy.
    hashers = ThreadPoolExecutor(max_workers=eng.workers)
    hashed = []

    def one(rel: str) -> None:
        """Copy one file into .incoming and queue its hashing."""
        copy_file(os.path.join(src, rel), os.path.join(eng.incoming, rel), src_files[rel]["st"], eng.counter)
        hashed.append(hashers.submit(eng.hash_incoming, rel))

    # At least two copiers: a copy that the kernel holds back (dirty-page throttling,
    # a full disk queue) leaves its CPU to the other one instead of to nobody.
    order = sorted(pending, key=lambda r: -pending[r]["size"])
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(max(2, eng.workers // 2), len(order)))) as copiers:
            list(copiers.map(one, order))
        for fut in hashed:
            fut.result()
    finally:
        hashers.shutdown(cancel_futures=True)
    eng.changed = True
