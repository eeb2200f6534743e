"""Writes that must survive a power cut: a file's bytes on disk before its name points at them, and
the name on disk before the writer says it is done.

A rename publishes a file or a directory whole, but only the page cache knows about either until
the kernel writes them back (half a minute or more later): after a power cut in between, the new
name can point at an empty file, or the old name come back. So each writer here, in this order:

1. writes the content under a temporary name (:func:`write_new`, through ``os.write``),
2. fsyncs it (the file; a staged directory too, for the names in it),
3. renames it over the real name (``os.replace``, or :func:`exchange` for two directories),
4. fsyncs the directory that holds the real name (:func:`publish`).

The deploy's records use it: the last-known-good record (inference_server's ``last_known_good``),
the converged record (converged's ``converged_state``) and the port guard's files
(:mod:`.install`). ``tests/shared/durability.py`` records the order of these calls in the tests of
each writer, so a missing step fails them. model_sync's package, which runs on hosts without
this one, keeps the same steps in its own ``fs`` module.
"""

from __future__ import annotations

import ctypes
import os

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def fsync_path(path: str) -> None:
    """fsync a file, or a directory so that the names created or renamed in it last."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: str, data: bytes, mode: int) -> None:
    """Create ``path`` (it must not exist) with ``data`` and ``mode`` (not the umask's), on disk when this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: str, path: str) -> None:
    """Rename ``staged`` (a file or directory already on disk) over ``path``, and make the rename last."""
    os.replace(staged, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def replace_file(path: str, data: bytes, mode: int) -> None:
    """Make ``path`` hold ``data`` (``mode``) whole: the old content or the new one, after a power cut too."""
    staged = f"{path}.tmp"  # one writer at a time (the deploy lock); a left-over of a killed one goes
    try:
        os.unlink(staged)
    except FileNotFoundError:
        pass
    write_new(staged, data, mode)
    publish(staged, path)


def exchange(a: str, b: str) -> None:
    """Swap the directories ``a`` and ``b`` atomically (renameat2 RENAME_EXCHANGE, Linux 3.15).

    Raises OSError (EINVAL or ENOSYS where the file system or kernel lacks it); the caller fsyncs
    the directory that holds them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)
