"""File-system helpers: scanning a tree, kernel copies, early write-back, fsync and publishing by rename."""

from __future__ import annotations

import os
import stat

from .common import SKIP_DIRS, TMP_PREFIX

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from .hashing import Counter

COPY_CHUNK = 64 << 20
_SYNC_FILE_RANGE: list = []


def scan(root: str) -> dict[str, os.stat_result]:
    """List regular files under ``root`` (relative path -> stat, symlinks followed).

    Skips rsync partial dirs, huggingface_hub metadata, VCS dirs and our temporary files.
    """
    out: dict[str, os.stat_result] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        base = os.path.join(root, rel) if rel else root
        try:
            entries = list(os.scandir(base))
        except FileNotFoundError:
            continue
        for entry in entries:
            name = entry.name
            if name.startswith(TMP_PREFIX):
                continue
            sub = f"{rel}/{name}" if rel else name
            if entry.is_dir():
                if name not in SKIP_DIRS:
                    stack.append(sub)
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[sub] = st
    return out


def inode_key(st: os.stat_result) -> str:
    """Cache key of an inode."""
    return f"{st.st_dev}:{st.st_ino}"


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing a file's dirty pages now, without waiting.

    sync_file_range(2) with SYNC_FILE_RANGE_WRITE, through libc: the disk works while the
    next file is copied and hashed, so the fsync before publishing has little left to wait
    for. Where libc lacks the call, nothing happens (the fsync still does the work).
    """
    if not _SYNC_FILE_RANGE:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            call = libc.sync_file_range
            call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
            _SYNC_FILE_RANGE.append(call)
        except (ImportError, OSError, AttributeError):
            _SYNC_FILE_RANGE.append(None)
    call = _SYNC_FILE_RANGE[0]
    if call is not None:
        call(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; a failure only forgoes the head start


def fsync_files(paths: list[str], workers: int) -> None:
    """fsync files, several at once: a revision's bytes are on disk before it is published.

    Without it a power cut soon after ``current`` switched could leave the link pointing at
    shards whose blocks were never written (delayed allocation keeps them in memory for up
    to half a minute, and writing back 50 GiB takes longer). A file with no dirty pages
    costs one cheap system call.
    """
    if len(paths) <= 1:
        for path in paths:
            fsync_path(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    # Threads wait on the disk, not the CPU: more of them than CPUs keeps the queue full.
    with ThreadPoolExecutor(max_workers=min(len(paths), max(4, workers))) as pool:
        list(pool.map(fsync_path, paths))


def fsync_path(path: str) -> None:
    """fsync a file, or a directory so that renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: str, path: str) -> None:
    """Rename ``staged`` (a file, link or directory already on disk) over ``path``, and make the rename last.

    The one way this package publishes what must survive a power cut (a revision, ``current``,
    a file written whole): its content fsynced first by the caller, then rename(2), then the
    directory that holds ``path`` fsynced (role llm_host's ``durable`` module does the same for
    the deploy's records; this package runs where that one is not).
    """
    os.replace(staged, path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole and on disk: a temporary file, fsynced, then :func:`publish`."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    publish(tmp, path)


def copy_file(src: str, dst: str, st: os.stat_result, counter: Counter) -> None:
    """Copy ``src`` to ``dst`` inside the kernel (copy_file_range), through a temporary file.

    No byte passes through Python: the copy costs what ``cp`` costs. A temporary file left
    by an interrupted copy is continued where it stopped. The source's mtime is kept and
    rename(2) publishes the file whole. The disk starts writing the copy at once
    (:func:`start_writeback`), so the fsync before the revision is published finds little
    left to do.
    """
    tmp = os.path.join(os.path.dirname(dst), TMP_PREFIX + os.path.basename(dst))
    sfd = os.open(src, os.O_RDONLY)
    try:
        dfd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            done = os.fstat(dfd).st_size
            if done > st.st_size:
                os.ftruncate(dfd, 0)
                done = 0
            os.lseek(sfd, done, os.SEEK_SET)
            os.lseek(dfd, done, os.SEEK_SET)
            _copy_fd(sfd, dfd, st.st_size - done, counter)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, dst)


def _copy_fd(sfd: int, dfd: int, count: int, counter: Counter) -> None:
    """Copy ``count`` bytes between file offsets: copy_file_range, else sendfile."""
    import errno

    fast = hasattr(os, "copy_file_range")
    while count > 0:
        chunk = min(count, COPY_CHUNK)
        if fast:
            try:
                n = os.copy_file_range(sfd, dfd, chunk)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                fast = False
                continue
        else:
            n = os.sendfile(dfd, sfd, None, chunk)
        if n == 0:  # the source shrank under us; verification will notice
            break
        start_writeback(dfd)  # per chunk: the disk keeps pace and the writer is not throttled
        count -= n
        counter.add("bytes_fetched", n)


def link_replace(src: str, dst: str) -> None:
    """Hard-link ``src`` to ``dst`` atomically (temporary name, then rename)."""
    tmp = os.path.join(os.path.dirname(dst), TMP_PREFIX + os.path.basename(dst))
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        shutil.copy2(src, tmp)
    os.replace(tmp, dst)
