#!/usr/bin/env python3
"""Put a staged last-known-good record in place in one step: ``lkg_commit STAGED LIVE``.

tasks/record_good.yml writes the whole record (the unit's inputs and state.json) into STAGED,
beside LIVE. This flushes STAGED to disk and then exchanges the two directories with one
renameat2(RENAME_EXCHANGE): a reader, a rollback or a kill at any instant finds either the
whole old record or the whole new one in LIVE, never a mixture. The old record (now at STAGED)
is then removed. A first record is a plain rename. When STAGED holds exactly what LIVE holds,
STAGED is removed and nothing changes (a no-op deploy stays unchanged). Prints
``{"changed": bool}``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
from pathlib import Path

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def contents(path: str) -> dict[str, bytes]:
    """Every file of the directory ``path`` (flat), by name."""
    return {name: Path(path, name).read_bytes() for name in sorted(os.listdir(path))}


def sync(*paths: str) -> None:
    """fsync each file or directory of ``paths`` (a directory: so that renames in it last)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def exchange(a: str, b: str) -> None:
    """Swap the directories ``a`` and ``b`` atomically (renameat2 RENAME_EXCHANGE, Linux 3.15)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


def commit(staged: str, live: str) -> bool:
    """Make ``staged`` the record at ``live``; True when that changed ``live``."""
    if os.path.isdir(live) and contents(staged) == contents(live):
        shutil.rmtree(staged)
        return False
    for name in os.listdir(staged):
        sync(os.path.join(staged, name))
    sync(staged)
    if not os.path.lexists(live):
        os.rename(staged, live)
    else:
        try:
            exchange(staged, live)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            # A file system without RENAME_EXCHANGE: two renames, LIVE missing between them
            # (a rollback then finds no record and says so; the record is at LIVE.old).
            os.rename(live, f"{live}.old")
            os.rename(staged, live)
            staged = f"{live}.old"
        shutil.rmtree(staged)
    sync(os.path.dirname(os.path.abspath(live)))
    return True


def main(argv: list[str]) -> int:
    """``lkg_commit STAGED LIVE``."""
    if len(argv) != 2:
        print("usage: lkg_commit STAGED LIVE", file=sys.stderr)
        return 2
    print(json.dumps({"changed": commit(*argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
