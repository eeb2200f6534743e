"""Names of the layout, the operator-facing error and small helpers shared by the engine."""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

INCOMING = ".incoming"
REVISIONS = "revisions"
CURRENT = "current"
PARTIAL = ".partial"
RSYNC_PARTIAL = ".rsync-partial"
LOCK_NAME = ".model-sync.lock"
MANIFEST_NAME = "manifest.sha256"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
TMP_PREFIX = ".model-sync-tmp."
SKIP_DIRS = frozenset({".cache", RSYNC_PARTIAL, ".git", ".huggingface"})
CACHE_VERSION = 2
GIB = float(1 << 30)


class SyncError(Exception):
    """A failure explained in one sentence for the operator."""


def json_module() -> ModuleType:
    """The json module, imported on first use (it pulls in ``re``: ~10 ms a no-op does not need)."""
    import json

    return json


def gib(n: int) -> str:
    """Format a byte count as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def now() -> float:
    """Monotonic seconds (for durations)."""
    return time.perf_counter()


def ids(owner: str, group: str) -> tuple[int, int]:
    """Resolve owner and group names (or numbers) to ids."""
    import grp
    import pwd

    uid = _id_of(owner, "owner", "user", lambda name: pwd.getpwnam(name).pw_uid)
    gid = _id_of(group, "group", "group", lambda name: grp.getgrnam(name).gr_gid)
    return uid, gid


def _id_of(name: str, var: str, kind: str, lookup: Callable[[str], int]) -> int:
    """The id ``name`` stands for (a number as is); refuses, naming ``model_sync_<var>``, one that does not exist."""
    try:
        return int(name) if name.isdigit() else lookup(name)
    except KeyError:
        raise SyncError(
            f"model_sync_{var} '{name}' does not exist on the host; create the {kind} first or change model_sync_{var}."
        ) from None


def thread_count(n: int) -> int:
    """Number of worker threads (0 = CPUs)."""
    return n if n > 0 else max(1, os.cpu_count() or 1)
