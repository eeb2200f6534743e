"""Would a power cut lose a write? Record a writer's fsyncs, writes and renames, then judge their order.

A power cut keeps only what was fsynced: a file's bytes once the file was fsynced, a name made or
renamed in a directory once that directory was fsynced. So a write that must survive needs, in
this order: its content fsynced (each file, and a staged directory for the names in it), the
rename that publishes it, then an fsync of the directory that holds the published name.
:func:`recorded` records, by inode, every ``os.fsync`` and ``os.write`` and, by path, every
``os.replace``, ``os.rename`` and the exchanges named; :func:`lost_on_power_cut` lists what of a
published path a power cut right after the writer returned could lose. ``drop`` makes the
writer lose its file or directory fsyncs, to show that the judge notices.

The page cache cannot be dropped from a test (``docker restart`` keeps it too), so this is the
way a missing fsync shows: by the order of the calls, not by a lost file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any

import pytest

Event = tuple[str, Any]


@contextlib.contextmanager
def recorded(
    monkeypatch: pytest.MonkeyPatch, exchanges: tuple[tuple[object, str], ...] = (), drop: str = ""
) -> Iterator[list[Event]]:
    """Record the file-system calls made inside the block; ``drop`` ("file" or "directory") skips those fsyncs.

    ``exchanges`` names (module, attribute) pairs of functions that swap two paths ``(a, b)``;
    each call is recorded as a rename onto both.
    """
    events: list[Event] = []
    real_fsync, real_write, real_replace, real_rename = os.fsync, os.write, os.replace, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        if drop != ("directory" if stat.S_ISDIR(st.st_mode) else "file"):
            real_fsync(fd)
            events.append(("fsync", st.st_ino))

    def write(fd: int, data: Any) -> int:
        events.append(("write", os.fstat(fd).st_ino))
        return real_write(fd, data)

    def renaming(real: Callable[..., None]) -> Callable[..., None]:
        def rename(src: str, dst: str, *args: Any, **kwargs: Any) -> None:
            real(src, dst, *args, **kwargs)
            events.append(("rename", os.path.abspath(dst)))

        return rename

    def exchanging(real: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def exchange(a: str, b: str) -> None:
            real(a, b)
            events.extend([("rename", os.path.abspath(b)), ("rename", os.path.abspath(a))])

        return exchange

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", fsync)
        patch.setattr(os, "write", write)
        patch.setattr(os, "replace", renaming(real_replace))
        patch.setattr(os, "rename", renaming(real_rename))
        for module, name in exchanges:
            patch.setattr(module, name, exchanging(getattr(module, name)))
        yield events


def lost_on_power_cut(events: list[Event], published: str) -> list[str]:
    """What of ``published`` (as it is now) a power cut right after the writer returned could lose: [] for nothing.

    Its last rename must come after an fsync of each of its files (and of itself, a directory)
    with no write after that fsync, and be followed by an fsync of its directory. A symbolic link
    has no fsync of its own: the directory's carries it.
    """
    published = os.path.abspath(published)
    renames = [i for i, event in enumerate(events) if event == ("rename", published)]
    if not renames:
        return [f"{published} was not renamed into place"]
    at = renames[-1]
    st = os.lstat(published)
    contents = {st.st_ino: published} if not stat.S_ISLNK(st.st_mode) else {}
    if stat.S_ISDIR(st.st_mode):
        for root, _, files in os.walk(published):
            for name in files:
                path = os.path.join(root, name)
                if stat.S_ISREG(os.lstat(path).st_mode):
                    contents[os.lstat(path).st_ino] = path
    lost = []
    for inode, path in contents.items():
        synced = [i for i, event in enumerate(events[:at]) if event == ("fsync", inode)]
        if not synced:
            lost.append(f"{path} was not fsynced before the rename that published it")
        elif ("write", inode) in events[synced[-1] : at]:
            lost.append(f"{path} was written after its fsync, before the rename that published it")
    if ("fsync", os.stat(os.path.dirname(published)).st_ino) not in events[at + 1 :]:
        lost.append(f"the directory of {published} was not fsynced after the rename that published it")
    return lost
