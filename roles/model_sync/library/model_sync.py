#!/usr/bin/python3
"""model_sync: put a model on a host atomically, resumably, verified.

One file, two faces:

* an Ansible module (``model_sync``, run by the ``model_sync`` role), and
* a standalone command line program (installed on hosts as ``model-sync``; used by the
  benchmark, the tests and operators): ``model-sync sync|switch|prune|verify|listing|manifest``.

Only the Python standard library is used, so the host's ``python3`` runs it.

Layout it maintains (``dest`` is ``<model_sync_root>/<model_sync_name>``)::

    dest/.incoming/              latest snapshot of the source (rsync target / copy target /
                                 huggingface_hub local_dir); interrupted transfers resume here
    dest/revisions/<rev>.partial staging of a revision being assembled (hard links)
    dest/revisions/<rev>/        verified revisions (hard links into the same inodes)
    dest/current -> revisions/<rev>   switched with rename(2) of a temporary symlink

sha256 sums are cached in ``<state_dir>/<key>.json`` by inode with size and mtime, so an
unchanged model is never read again.
"""
from __future__ import annotations

import os
import stat
import sys
import time
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

DOCUMENTATION = r"""
---
module: model_sync
short_description: Sync, verify and atomically switch a model directory
description:
  - Brings a model from a source into C(dest/.incoming), verifies it (C(config.json),
    every weight file named in C(model.safetensors.index.json), safetensors header sizes,
    sha256 against the source's manifest or a size+mtime cache), assembles
    C(dest/revisions/<rev>) from hard links, switches C(dest/current) atomically and
    prunes old revisions.
  - The same file is a command line program (C(model-sync --help)).
  - Check mode reports what would be transferred, linked, switched and pruned.
version_added: "1.0.0"
options:
  action:
    description:
      - C(sync) fetches, verifies and stages a revision (no switch).
      - C(switch) points C(dest/current) at a staged revision.
      - C(prune) removes old revisions.
      - C(verify) checks a model directory in place (host_path sources).
      - C(space) checks free space for the files in I(source_listing) before a push.
    type: str
    choices: [sync, switch, prune, verify, space]
    default: sync
  dest:
    description: Directory of this model, C(<model_sync_root>/<model_sync_name>).
    type: path
  path:
    description: Model directory to verify (I(action=verify)).
    type: path
  source:
    description:
      - Where the model comes from. C(type) is one of C(controller_dir) (the role has
        already pushed it into C(dest/.incoming)), C(mirror) (C(host) + C(path) over SSH
        with rsync, or a local C(path) when C(host) is empty), C(hub) (C(repo_id),
        C(revision)).
    type: dict
    default: {}
  source_listing:
    description: Files of a controller-side source, as printed by C(model-sync listing).
    type: list
    elements: dict
    default: []
  revision:
    description: Explicit revision label; derived when empty.
    type: str
    default: ""
  state_dir:
    description: Where the sha256 cache and revision manifests are kept.
    type: path
    default: /var/lib/model-sync
  owner:
    description: Owner of model files and directories.
    type: str
    default: root
  group:
    description: Group of model files and directories.
    type: str
    default: root
  mode:
    description: Mode of model files (octal string).
    type: str
    default: "0644"
  dir_mode:
    description: Mode of model directories (octal string).
    type: str
    default: "0755"
  keep:
    description: Previous revisions kept besides the current one.
    type: int
    default: 1
  protect_paths:
    description: Paths (e.g. the model dir of the running unit) whose revision is never pruned.
    type: list
    elements: path
    default: []
  workers:
    description: Parallel hashing and copying threads (0 = number of CPUs).
    type: int
    default: 0
  verify:
    description: C(cached) trusts the size+mtime cache; C(full) re-hashes every file.
    type: str
    choices: [cached, full]
    default: cached
  reserve_mib:
    description: Free space that must remain on the file system after the transfer.
    type: int
    default: 1024
  rsync_opts:
    description: Extra rsync options for mirror sources (e.g. C(--bwlimit=50M)).
    type: list
    elements: str
    default: []
  ssh_opts:
    description: Options for the ssh command rsync uses (e.g. C(-i /root/.ssh/mirror)).
    type: list
    elements: str
    default: []
  hub_python:
    description: Python of the target venv that has C(huggingface_hub) (hub sources).
    type: path
  hf_token:
    description: Hugging Face token; passed to the downloader in its environment only.
    type: str
  hub_endpoint:
    description: Hub endpoint (C(HF_ENDPOINT)) for the downloader; empty = the default.
    type: str
    default: ""
  refetch:
    description: Whether I(action=sync) may fetch a file again after a sha256 mismatch.
    type: bool
    default: true
author:
  - llm-deploy maintainers
"""

EXAMPLES = r"""
- name: Stage the model from the mirror host
  model_sync:
    dest: /srv/models/tiny-qwen3.5
    source: {type: mirror, host: mirror, path: /srv/mirror/tiny-qwen3.5}
  register: __model_sync_staged

- name: Switch the current link to the staged revision
  model_sync:
    action: switch
    dest: /srv/models/tiny-qwen3.5
    revision: "{{ __model_sync_staged.revision }}"
"""

RETURN = r"""
revision:
  description: Revision label.
  returned: sync, switch
  type: str
model_dir:
  description: Resolved revision directory (the path the unit must use).
  returned: sync, switch, verify
  type: str
config:
  description: The model's config.json.
  returned: sync, verify
  type: dict
weights_bytes:
  description: Total bytes of the weight files.
  returned: sync, verify
  type: int
plan:
  description: What was (or in check mode would be) fetched, linked, repaired, switched, pruned.
  returned: always
  type: dict
stats:
  description: Counters (bytes fetched, bytes hashed, seconds).
  returned: always
  type: dict
refetch:
  description: Files removed from C(.incoming) after a sha256 mismatch (controller_dir).
  returned: sync
  type: list
"""

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
BUF_SIZE = 8 << 20
COPY_CHUNK = 64 << 20
CACHE_VERSION = 2
GIB = float(1 << 30)
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t"})


class SyncError(Exception):
    """A failure explained in one sentence for the operator."""


# --------------------------------------------------------------------------- helpers


def _json():  # noqa: ANN202 (returns the json module)
    """The json module, imported on first use (it pulls in ``re``: ~10 ms a no-op does not need)."""
    import json

    return json


def dumps(obj: object) -> str:
    """Serialise plain data (dict, list, tuple, str, int, float, bool, None) as compact JSON.

    A small encoder instead of ``json.dumps`` so that a no-op run never imports ``json``.
    """
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, str):
        return '"' + obj.translate(_ESCAPES) + '"'
    if isinstance(obj, (int, float)):
        return repr(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else "null"
    if isinstance(obj, dict):
        return "{" + ",".join(dumps(str(k)) + ":" + dumps(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(obj, (list, tuple, set, frozenset)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return dumps(str(obj))


def _gib(n: int) -> str:
    """Format a byte count as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def _now() -> float:
    """Monotonic seconds (for durations)."""
    return time.perf_counter()


def _atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and rename(2)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _ids(owner: str, group: str) -> tuple[int, int]:
    """Resolve owner and group names (or numbers) to ids."""
    import grp
    import pwd

    try:
        uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise SyncError(f"model_sync_owner '{owner}' does not exist on the host; create the user first or change model_sync_owner.") from None
    try:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise SyncError(f"model_sync_group '{group}' does not exist on the host; create the group first or change model_sync_group.") from None
    return uid, gid


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


def _inode_key(st: os.stat_result) -> str:
    """Cache key of an inode."""
    return f"{st.st_dev}:{st.st_ino}"


# --------------------------------------------------------------------------- cache


class State:
    """sha256 cache (by inode, valid while size and mtime are unchanged) and revision manifests."""

    def __init__(self, state_dir: str, dest: str, writable: bool) -> None:
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
        hit = self.data["inodes"].get(_inode_key(st))
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        return None

    def stale(self, st: os.stat_result) -> str | None:
        """Cached sha256 recorded for the same inode, size and mtime (for full verification)."""
        return self.lookup(st)

    def store(self, st: os.stat_result, digest: str) -> None:
        """Remember the sha256 of an inode with its size and mtime."""
        self.data["inodes"][_inode_key(st)] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True

    def revision(self, label: str) -> dict | None:
        """Recorded manifest of a revision."""
        return self.data["revisions"].get(label)

    def record_revision(self, label: str, files: dict[str, list], source: str) -> None:
        """Record a verified revision's manifest."""
        old = self.data["revisions"].get(label, {})
        if old.get("files") == files and old.get("source") == source:
            return  # a no-op run writes nothing
        self.data["revisions"][label] = {"files": files, "source": source,
                                         "created": old.get("created", time.time())}
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
            _atomic_write(self.path, marshal.dumps(self.data))
            self.dirty = False

    def model_check(self, fingerprint: tuple) -> dict | None:
        """Result of an earlier :func:`check_model` for the same files (paths, inodes, sizes, mtimes)."""
        hit = self.data["models"].get("last")
        return hit[1] if hit and hit[0] == fingerprint else None

    def store_model_check(self, fingerprint: tuple, result: dict) -> None:
        """Remember a :func:`check_model` result."""
        self.data["models"]["last"] = (fingerprint, result)
        self.dirty = True


# --------------------------------------------------------------------------- hashing


class Counter:
    """Thread-safe byte counters."""

    def __init__(self) -> None:
        self.lock = None
        self.values: dict[str, float] = {"bytes_hashed": 0, "bytes_fetched": 0, "files_hashed": 0}

    def add(self, key: str, n: float) -> None:
        """Add ``n`` to counter ``key``."""
        if self.lock is None:
            import threading

            self.lock = threading.Lock()
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n


def sha256_fd(fd: int, mapped: bool = False, counter: Counter | None = None) -> str:
    """sha256 of an open file from its start (its bytes counted in ``counter``).

    ``mapped`` hashes straight from a read-only mapping of the page cache: no copy into a
    buffer, about a tenth less CPU, which counts when the copy of the next shard wants the
    same two cores. Only for files this engine wrote and holds under its lock: a file
    truncated while mapped would kill the process with SIGBUS. Read into a reused buffer
    otherwise (or if the file cannot be mapped). hashlib releases the GIL either way.
    """
    import hashlib

    h = hashlib.sha256()
    size = os.fstat(fd).st_size
    if mapped and size:
        import mmap

        try:
            region = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            region = None
        if region is not None:
            with region:
                if hasattr(region, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                    region.madvise(mmap.MADV_SEQUENTIAL)
                view = memoryview(region)
                try:
                    for off in range(0, size, BUF_SIZE):
                        part = view[off:off + BUF_SIZE]
                        h.update(part)
                        part.release()  # the mapping closes only once no view is left
                finally:
                    view.release()
            return _counted(h.hexdigest(), size, counter)
    buf = bytearray(BUF_SIZE)
    view = memoryview(buf)
    total = 0
    os.lseek(fd, 0, os.SEEK_SET)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    while True:
        n = os.readv(fd, [buf])
        if not n:
            break
        h.update(view[:n])
        total += n
    return _counted(h.hexdigest(), total, counter)


def _counted(digest: str, nbytes: int, counter: Counter | None) -> str:
    """Count one hashed file of ``nbytes`` in ``counter``; returns ``digest``."""
    if counter:
        counter.add("bytes_hashed", nbytes)
        counter.add("files_hashed", 1)
    return digest


def sha256_file(path: str, counter: Counter | None = None) -> str:
    """sha256 of a file, read with a large reused buffer (see :func:`sha256_fd`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return sha256_fd(fd, counter=counter)
    finally:
        os.close(fd)


def _workers(n: int) -> int:
    """Number of worker threads (0 = CPUs)."""
    return n if n > 0 else max(1, os.cpu_count() or 1)


def hash_many(paths: list[tuple[str, int]], workers: int, counter: Counter) -> dict[str, str]:
    """Hash files in parallel across files, largest first; returns path -> sha256."""
    if not paths:
        return {}
    ordered = sorted(paths, key=lambda p: -p[1])
    if workers <= 1 or len(ordered) == 1:
        return {p: sha256_file(p, counter) for p, _ in ordered}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, len(ordered))) as pool:
        futures = {p: pool.submit(sha256_file, p, counter) for p, _ in ordered}
        return {p: f.result() for p, f in futures.items()}


_SYNC_FILE_RANGE: list = []


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


# --------------------------------------------------------------------------- model checks


def read_manifest_file(path: str) -> dict[str, str]:
    """Parse a ``sha256sum``-style manifest (``<hex>  <path>``) into path -> sha256."""
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 1)
            if len(parts) != 2 or len(parts[0]) != 64:
                raise SyncError(f"{path} line {lineno} is not '<sha256>  <file>'; fix the mirror's manifest.")
            name = parts[1].lstrip("*").strip()
            if name.startswith("./"):
                name = name[2:]
            out[name] = parts[0].lower()
    return out


def safetensors_size(path: str) -> int | None:
    """File size implied by a safetensors header (8 + header + data), or None if unreadable."""
    import struct

    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                return None
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                return None
            header = _json().loads(fh.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return 8 + n + end
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_model(root: str, files: dict[str, os.stat_result], rehashed: set[str], what: str) -> dict:
    """Check that ``files`` form a loadable model; returns config, weight files and notes.

    Raises SyncError naming the missing or wrong file.
    """
    notes: list[str] = []
    if "config.json" not in files:
        raise SyncError(f"{what} has no config.json, so it is not a model directory; point model_sync_source at the directory that holds config.json.")
    try:
        with open(os.path.join(root, "config.json"), encoding="utf-8") as fh:
            config = _json().load(fh)
    except ValueError as exc:
        raise SyncError(f"config.json in {what} is not valid JSON ({exc}).") from None
    if INDEX_NAME in files:
        try:
            with open(os.path.join(root, INDEX_NAME), encoding="utf-8") as fh:
                index = _json().load(fh)
            weights = sorted(set(index["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SyncError(f"{INDEX_NAME} in {what} has no usable weight_map.") from None
        missing = [w for w in weights if w not in files]
        if missing:
            raise SyncError(f"{what} lacks {len(missing)} weight file(s) named in {INDEX_NAME}: {', '.join(missing[:5])}.")
        total = (index.get("metadata") or {}).get("total_size")
    elif SINGLE_NAME in files:
        weights, total = [SINGLE_NAME], None
    else:
        raise SyncError(f"{what} has neither {INDEX_NAME} nor {SINGLE_NAME}; no weights to load.")
    data_bytes = 0
    for w in weights:
        if w in rehashed or total is not None:
            expect = safetensors_size(os.path.join(root, w)) if w in rehashed else None
            if w in rehashed and expect is None:
                raise SyncError(f"{w} in {what} has no readable safetensors header.")
            if expect is not None and expect != files[w].st_size:
                raise SyncError(f"{w} in {what} is {files[w].st_size} bytes but its safetensors header says {expect}; the file is truncated or corrupt.")
    weights_bytes = sum(files[w].st_size for w in weights)
    if total is not None and weights_bytes < int(total):
        raise SyncError(f"weight files in {what} hold {weights_bytes} bytes, less than the {total} bytes of tensors {INDEX_NAME} announces.")
    del data_bytes
    return {"config": config, "weights": weights, "weights_bytes": weights_bytes, "notes": notes}


def revision_label(manifest: dict[str, list]) -> str:
    """Content-derived revision label: sha256 over sorted (path, size, sha256), 12 hex digits."""
    import hashlib

    h = hashlib.sha256()
    for rel in sorted(manifest):
        size, digest = manifest[rel]
        h.update(f"{rel}\0{size}\0{digest}\n".encode())
    return h.hexdigest()[:12]


def _clean_label(label: str) -> str:
    """Refuse labels that are not a single safe path component."""
    if not label or label in (".", "..") or "/" in label or label.startswith(".") or label.endswith(PARTIAL) or len(label) > 128:
        raise SyncError(f"revision label '{label}' (model_sync_source.revision) is not usable as a directory name; use letters, digits, '-', '_' or '.'.")
    return label


# --------------------------------------------------------------------------- engine


class Engine:
    """Plan, fetch, verify, stage, switch and prune one model's revisions."""

    def __init__(self, dest: str, *, source: dict | None = None, revision: str = "",
                 state_dir: str = "/var/lib/model-sync", owner: str = "root", group: str = "root",
                 mode: str = "0644", dir_mode: str = "0755", keep: int = 1,
                 protect_paths: list[str] | None = None, workers: int = 0, verify: str = "cached",
                 reserve_mib: int = 1024, rsync_opts: list[str] | None = None,
                 ssh_opts: list[str] | None = None, hub_python: str | None = None,
                 hf_token: str | None = None, hub_endpoint: str = "", refetch: bool = True, check: bool = False,
                 source_listing: list[dict] | None = None,
                 log: "Callable[[str], object] | None" = None) -> None:
        self.dest = os.path.abspath(dest)
        self.source = dict(source or {})
        self.revision = revision or ""
        self.state_dir = state_dir
        self.owner, self.group = owner, group
        self.mode, self.dir_mode = int(str(mode), 8), int(str(dir_mode), 8)
        self.keep = keep
        self.protect_paths = list(protect_paths or [])
        self.workers = _workers(workers)
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
        self.plan: dict = {"fetch": [], "fetch_bytes": 0, "link": [], "repair": [], "remove": [],
                           "switch": None, "prune": [], "notes": []}
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
            self._uid_gid = _ids(self.owner, self.group)
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

    def lock(self) -> "IO[str] | None":
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
                    raise SyncError(f"another model-sync holds {fh.name} for over an hour; check for a stuck run.") from None
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
                f"the transfer needs {_gib(need)} ({need} bytes) plus the {_gib(self.reserve)} reserve "
                f"(model_sync_disk_reserve_mib), but only {_gib(free)} ({free} bytes) are free; "
                "nothing was copied.")

    # ----- fetchers (bring the source into .incoming)

    def _pending_local(self, src_files: dict[str, dict]) -> dict[str, dict]:
        """Files of a listing that .incoming lacks (by size and mtime)."""
        have = scan(self.incoming)
        pending = {}
        for rel, meta in src_files.items():
            st = have.get(rel)
            if st is None or st.st_size != meta["size"] or (meta.get("mtime_ns") is not None and st.st_mtime_ns != meta["mtime_ns"]):
                pending[rel] = meta
        return pending

    def fetch_local(self) -> None:
        """Copy a local mirror directory into .incoming (kernel copies, hashed as they land)."""
        src = self.source["path"]
        if not os.path.isdir(src):
            raise SyncError(f"model_sync_source.path {src} is not a directory on the host.")
        src_files = {rel: {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "st": st} for rel, st in scan(src).items()}
        pending = self._pending_local(src_files)
        need = sum(m["size"] for m in pending.values())
        self._plan_fetch(pending)
        self.check_space(need)
        self._remove_extra(set(src_files))
        if self.check or not pending:
            return
        self.makedirs(self.incoming)
        for rel in pending:
            self.makedirs(os.path.dirname(os.path.join(self.incoming, rel)))
        from concurrent.futures import ThreadPoolExecutor

        # A pipeline: the kernel copies file i while threads hash the copies already made
        # (their pages are still in the cache), so verification of what was written costs
        # no second pass over the disk and overlaps the copy.
        hashers = ThreadPoolExecutor(max_workers=self.workers)
        hashed = []

        def one(rel: str) -> None:
            copy_file(os.path.join(src, rel), os.path.join(self.incoming, rel), src_files[rel]["st"], self.counter)
            hashed.append(hashers.submit(self._hash_incoming, rel))

        # At least two copiers: a copy that the kernel holds back (dirty-page throttling,
        # a full disk queue) leaves its CPU to the other one instead of to nobody.
        order = sorted(pending, key=lambda r: -pending[r]["size"])
        try:
            with ThreadPoolExecutor(max_workers=max(1, min(max(2, self.workers // 2), len(order)))) as copiers:
                list(copiers.map(one, order))
            for fut in hashed:
                fut.result()
        finally:
            hashers.shutdown(cancel_futures=True)
        self.changed = True

    def _remove_extra(self, keep: set[str]) -> None:
        """Remove files from .incoming that the source no longer has."""
        for rel in sorted(set(scan(self.incoming)) - keep):
            self.plan["remove"].append(f"{INCOMING}/{rel}")
            if not self.check:
                os.unlink(os.path.join(self.incoming, rel))
                self.changed = True

    def _plan_fetch(self, pending: dict[str, dict]) -> None:
        """Record files to fetch in the plan."""
        for rel in sorted(pending):
            self.plan["fetch"].append({"path": rel, "size": pending[rel]["size"]})
        self.plan["fetch_bytes"] = sum(m["size"] for m in pending.values())

    def _rsync_base(self, control_dir: str) -> list[str]:
        """rsync argv common to the dry run and the transfer.

        ssh shares one connection between the two (ControlMaster), and prefers AES-GCM,
        which costs far less CPU than chacha20 where the CPU has AES instructions, leaving
        cycles for hashing the files as they arrive. ``model_sync_ssh_opts`` come first and
        so win over these defaults.
        """
        import shlex

        ssh = (["ssh"] + self.ssh_opts +
               ["-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C",
                "-o", "ControlPersist=60",
                "-o", "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"])
        return ["rsync", "-rlt", "--delete", f"--partial-dir={RSYNC_PARTIAL}",
                "-e", " ".join(shlex.quote(a) for a in ssh)] + self.rsync_opts

    def _remote(self) -> str:
        """rsync's address of the mirror directory."""
        host, path = self.source["host"], self.source["path"].rstrip("/") + "/"
        user = self.source.get("user")
        return f"{user + '@' if user else ''}{host}:{path}"

    def fetch_ssh(self) -> None:
        """Pull from an rsync mirror over SSH into .incoming; hash files as rsync completes them."""
        import shutil
        import subprocess
        import tempfile

        control_dir = tempfile.mkdtemp(prefix="model-sync-ssh.")
        try:
            self._fetch_ssh(control_dir)
        finally:
            user = self.source.get("user")
            subprocess.run(["ssh"] + self.ssh_opts + ["-o", f"ControlPath={control_dir}/%C", "-O", "exit",
                            f"{user + '@' if user else ''}{self.source['host']}"], capture_output=True)
            shutil.rmtree(control_dir, ignore_errors=True)

    def _fetch_ssh(self, control_dir: str) -> None:
        """Body of :meth:`fetch_ssh` with the ssh control socket directory."""
        import subprocess

        # Dry run first: what would move, for the plan and the disk check.
        argv = self._rsync_base(control_dir) + ["--dry-run", "--out-format=%i %l %n", self._remote(), self.incoming + "/"]
        if not os.path.isdir(self.incoming):
            os.mkdir(os.path.join(control_dir, "empty"))
            argv[-1] = os.path.join(control_dir, "empty") + "/"
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SyncError(f"rsync could not list {self._remote()} (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
        pending: dict[str, dict] = {}
        for line in proc.stdout.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[0][:2] in (">f", "<f") and not parts[2].endswith("/"):
                if "+" in parts[0] or "s" in parts[0][2:] or "t" in parts[0][2:] or "c" in parts[0][2:]:
                    pending[parts[2]] = {"size": int(parts[1])}
            elif line.startswith("*deleting"):  # "*deleting   0 name": the name is the third field
                self.plan["remove"].append(f"{INCOMING}/{line[len('*deleting'):].lstrip().split(' ', 1)[-1]}")
        self._plan_fetch(pending)
        self.check_space(self.plan["fetch_bytes"])
        if self.check or (not pending and not self.plan["remove"]):
            return
        self.makedirs(self.incoming)
        from concurrent.futures import ThreadPoolExecutor

        # rsync names a file (%n) when its data has arrived, just before renaming it into
        # place; once it names the next one, the previous file is in place and is hashed
        # while rsync goes on. The hash is cached under the inode it read, so an early or
        # stale read can never stand for the new file.
        argv = self._rsync_base(control_dir) + ["--out-format=%n", self._remote(), self.incoming + "/"]
        pool = ThreadPoolExecutor(max_workers=max(1, self.workers - 1))
        futures = {}
        import tempfile

        with tempfile.TemporaryFile(mode="w+") as errors:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
            previous = None
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if previous in pending and previous not in futures:
                        futures[previous] = pool.submit(self._hash_incoming, previous)
                    previous = line.rstrip("\n")
                rc = proc.wait()
            except BaseException:
                proc.kill()
                raise
            errors.seek(0)
            err = errors.read()
        if rc != 0:
            pool.shutdown(wait=False, cancel_futures=True)
            raise SyncError(f"rsync from {self._remote()} failed (exit {rc}); the partial transfer is kept in "
                            f"{self.incoming} and the next run resumes: {err.strip()[-400:]}")
        if previous in pending and previous not in futures:
            futures[previous] = pool.submit(self._hash_incoming, previous)
        for fut in futures.values():
            fut.result()
        pool.shutdown()
        self.counter.add("bytes_fetched", self.plan["fetch_bytes"])
        self.changed = True

    def _hash_incoming(self, rel: str) -> None:
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

    def _hub(self, mode: str) -> str:
        """Run the huggingface_hub helper in the target venv; the token travels in its environment."""
        import subprocess

        python = self.hub_python or "python3"
        if not os.path.exists(python):
            raise SyncError(f"model_sync_hub_python {python} does not exist; install the venv (ml_env) first or set model_sync_hub_python.")
        env = dict(os.environ)
        env.pop("HF_TOKEN", None)
        env["HF_HUB_DISABLE_TELEMETRY"] = "1"
        env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        if self.hf_token:
            env["MODEL_SYNC_HF_TOKEN"] = self.hf_token
        if self.hub_endpoint:
            env["HF_ENDPOINT"] = self.hub_endpoint
        src = self.source
        argv = [python, "-c", HUB_HELPER, mode, src["repo_id"], str(src.get("revision") or "main"),
                self.incoming, str(self.workers)]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["no error output"]
            msg = tail[0]
            if self.hf_token:
                msg = msg.replace(self.hf_token, "********")
            raise SyncError(hub_failure(msg, src["repo_id"], str(src.get("revision")), mode, bool(self.hf_token),
                                        self.incoming))
        return proc.stdout

    def fetch_hub(self) -> tuple[str, dict[str, str]]:
        """Download a pinned Hub revision into .incoming; returns the commit sha and expected sha256."""
        info = _json().loads(self._hub("info"))
        have = scan(self.incoming)
        expected = {f["path"]: f["sha256"] for f in info["files"] if f.get("sha256")}
        pending = {}
        for f in info["files"]:
            st = have.get(f["path"])
            if st is None or st.st_size != f["size"] or (f.get("sha256") and self.state.lookup(st) != f["sha256"]):
                pending[f["path"]] = {"size": f["size"]}
        self._plan_fetch(pending)
        self.check_space(self.plan["fetch_bytes"])
        self._remove_extra({f["path"] for f in info["files"]})
        if not self.check and pending:
            self.makedirs(self.incoming)
            self._hub("download")
            self.counter.add("bytes_fetched", self.plan["fetch_bytes"])
            self.changed = True
        return info.get("sha") or "", expected

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

    def verify_incoming(self, expected: dict[str, str]) -> tuple[dict[str, os.stat_result], dict[str, str], set[str], list[str]]:
        """Hash .incoming and compare with the source manifest; returns files, hashes, rehashed, bad."""
        files = scan(self.incoming)
        if MANIFEST_NAME in files:
            expected = {**read_manifest_file(os.path.join(self.incoming, MANIFEST_NAME)), **expected}
        hashes, rehashed, rotten = self.hash_tree(self.incoming, files)
        bad = sorted(set(rotten) | {rel for rel, d in expected.items() if rel in hashes and hashes[rel] != d})
        missing = sorted(rel for rel in expected if rel not in files)
        if missing:
            raise SyncError(f"the source lacks {', '.join(missing[:5])}, which its {MANIFEST_NAME} lists; fix the mirror.")
        return files, hashes, rehashed, bad

    # ----- the sync action

    def sync(self) -> dict:
        """Fetch, verify and stage a revision (does not switch ``current``)."""
        t0 = _now()
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
            self.fetch_ssh()
            return "", {}
        if kind == "mirror":
            self.fetch_local()
            return "", {}
        if kind == "hub":
            return self.fetch_hub()
        if kind == "controller_dir":
            if self.source_listing:
                listing = {f["path"]: f for f in self.source_listing}
                pending = self._pending_local(listing)
                self._plan_fetch(pending)
            return "", {}
        raise SyncError(f"model_sync_source.type '{kind}' is not one of controller_dir, mirror, hub, host_path.")

    def _sync(self, t0: float) -> dict:
        """Body of :meth:`sync` (lock held)."""
        commit, expected = self._fetch()
        self.timings["fetch_s"] = _now() - t0
        if self.check and (self.plan["fetch"] or not os.path.isdir(self.incoming)):
            return self._check_result(commit)
        t1 = _now()
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
                return {"changed": True, "refetch": bad, "plan": self.plan, "stats": self.stats(t0),
                        "msg": f"sha256 mismatch in {', '.join(bad)}; removed from {INCOMING} so the next push fetches it again"}
            again = " after fetching again" if self.plan.get("refetched") or not self.refetch else ""
            raise SyncError(f"sha256 mismatch in {', '.join(bad)}{again}; the source itself is corrupt or its manifest is wrong.")
        model = self.checked_model(self.incoming, files, rehashed, f"the source snapshot {self.incoming}")
        self.plan["notes"].extend(model["notes"])
        manifest = {rel: [files[rel].st_size, hashes[rel]] for rel in sorted(files)}
        if "label" not in model:  # content digest, cached with the model check
            model["label"] = revision_label(manifest)
        label = _clean_label(self.revision or (commit[:12] if commit else "") or
                             str(self.source.get("revision") or "") or model["label"])
        self.timings["verify_s"] = _now() - t1
        if not self.check:
            if self.fix_tree_attrs(self.incoming, files):
                self.changed = True
        t2 = _now()
        target = self.stage(label, files, hashes)
        self.timings["stage_s"] = _now() - t2
        if not self.check:
            self.state.record_revision(label, manifest, self.describe_source())
        current = self.current_target()
        if current != os.path.join(REVISIONS, label):
            self.plan["switch"] = {"from": current, "to": os.path.join(REVISIONS, label)}
        return {"changed": self.changed, "revision": label, "model_dir": target,
                "config": model["config"], "weights_bytes": model["weights_bytes"],
                "weights": model["weights"], "plan": self.plan, "stats": self.stats(t0), "refetch": []}

    def _check_result(self, commit: str) -> dict:
        """Check-mode answer when the new content is not on the host yet (label unknown)."""
        label = self.revision or (commit[:12] if commit else "") or str(self.source.get("revision") or "")
        self.plan["switch"] = {"from": self.current_target(),
                               "to": os.path.join(REVISIONS, label) if label else "a new revision (label derived after transfer)"}
        self.changed = True
        return {"changed": True, "revision": label, "model_dir": os.path.join(self.revisions, label) if label else "",
                "config": {}, "weights_bytes": sum(f["size"] for f in self.plan["fetch"]), "weights": [],
                "plan": self.plan, "stats": self.stats(_now()), "refetch": []}

    def checked_model(self, root: str, files: dict[str, os.stat_result], rehashed: set[str], what: str) -> dict:
        """:func:`check_model`, skipped when the same inodes, sizes and mtimes passed it before."""
        fingerprint = (root,) + tuple((rel, st.st_ino, st.st_size, st.st_mtime_ns) for rel, st in sorted(files.items()))
        if not rehashed and self.verify != "full":
            hit = self.state.model_check(fingerprint)
            if hit is not None:
                return hit
        model = check_model(root, files, rehashed, what)
        self.state.store_model_check(fingerprint, model)
        return model

    def describe_source(self) -> str:
        """One-line description of the source (no secrets)."""
        s = self.source
        if s.get("type") == "hub":
            return f"hub:{s.get('repo_id')}@{s.get('revision')}"
        if s.get("host"):
            return f"mirror:{s.get('host')}:{s.get('path')}"
        return f"{s.get('type')}:{s.get('path')}"

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
        t0 = _now()
        fsync_files([os.path.join(self.incoming, rel) for rel in sorted(files)], self.workers)
        self.timings["fsync_s"] = _now() - t0
        have = scan(partial)
        for rel in sorted(files):
            src = os.path.join(self.incoming, rel)
            dst = os.path.join(partial, rel)
            st = have.get(rel)
            if st is not None and (st.st_dev, st.st_ino) == (files[rel].st_dev, files[rel].st_ino):
                continue
            self.makedirs(os.path.dirname(dst))
            self._link_replace(src, dst)
        for rel in set(have) - set(files):
            os.unlink(os.path.join(partial, rel))
        self.fix_tree_attrs(partial, {})
        fsync_path(partial)
        os.rename(partial, target)
        fsync_path(self.revisions)
        return target

    def _link_replace(self, src: str, dst: str) -> None:
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
            self._link_replace(os.path.join(self.incoming, item["path"]), dst)
        for rel in extra:
            os.unlink(os.path.join(target, rel))

    # ----- switch and prune

    def current_target(self) -> str | None:
        """What ``current`` points at (as stored in the link), or None."""
        try:
            return os.readlink(os.path.join(self.dest, CURRENT))
        except FileNotFoundError:
            return None
        except OSError:
            raise SyncError(f"{os.path.join(self.dest, CURRENT)} exists and is not a symlink; move it away so model_sync can manage it.") from None

    def switch(self, label: str) -> dict:
        """Point ``current`` at ``revisions/<label>`` with rename(2) of a temporary link."""
        label = _clean_label(label)
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
            os.replace(tmp, link)
            fsync_path(self.dest)
        return result

    def prune(self) -> dict:
        """Remove revisions beyond the newest ``keep`` previous ones; never the current or protected."""
        lock = self.lock()
        try:
            current = self.current_target()
            protected = {os.path.realpath(p) for p in self.protect_paths if p}
            if current:
                protected.add(os.path.realpath(os.path.join(self.dest, current)))
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
                    live.update(_inode_key(st) for st in scan(root).values())
                self.state.gc(live)
            return {"changed": bool(doomed), "plan": self.plan, "pruned": self.plan["prune"], "kept": keepers}
        finally:
            self.state.save()
            if lock:
                lock.close()

    # ----- verify in place (host_path)

    def verify_dir(self, path: str) -> dict:
        """Verify a model directory in place: config, index, sizes, sha256 (manifest or cache)."""
        t0 = _now()
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
            raise SyncError(f"sha256 mismatch in {', '.join(bad)} under {path}; a host_path source is only verified, so replace the file(s) by hand.")
        model = self.checked_model(path, files, rehashed, path)
        manifest = {rel: [files[rel].st_size, hashes[rel]] for rel in sorted(files)}
        if "label" not in model:
            model["label"] = revision_label(manifest)
        label = _clean_label(self.revision or model["label"])
        return {"changed": False, "revision": label, "model_dir": path, "config": model["config"],
                "weights_bytes": model["weights_bytes"], "weights": model["weights"],
                "plan": self.plan, "stats": self.stats(t0)}

    def space(self) -> dict:
        """Disk check for a controller-side push (``source_listing`` against .incoming)."""
        listing = {f["path"]: f for f in self.source_listing}
        pending = self._pending_local(listing)
        self._plan_fetch(pending)
        self.check_space(self.plan["fetch_bytes"])
        return {"changed": False, "plan": self.plan, "stats": self.stats(_now())}

    def stats(self, t0: float) -> dict:
        """Counters and timings."""
        out = {k: int(v) for k, v in self.counter.values.items()}
        out.update({k: round(v, 4) for k, v in self.timings.items()})
        out["seconds"] = round(_now() - t0, 4)
        return out


HUB_HELPER = r"""
import json, os, sys
from huggingface_hub import HfApi, snapshot_download
mode, repo, rev, local_dir, workers = sys.argv[1:6]
token = os.environ.pop("MODEL_SYNC_HF_TOKEN", None) or False
try:
    if mode == "info":
        info = HfApi().model_info(repo, revision=rev, files_metadata=True, token=token)
        files = []
        for s in info.siblings or []:
            lfs = getattr(s, "lfs", None)
            sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
            files.append({"path": s.rfilename, "size": s.size, "sha256": sha})
        print(json.dumps({"sha": info.sha, "files": files}))
    else:
        snapshot_download(repo_id=repo, revision=rev, local_dir=local_dir, token=token,
                          max_workers=int(workers))
except Exception as exc:
    response = getattr(exc, "response", None)
    first = (str(exc).strip().splitlines() or [""])[0]
    print(json.dumps({"hub_error": type(exc).__name__, "status": getattr(response, "status_code", None),
                      "message": first[:300]}), file=sys.stderr)
    sys.exit(1)
"""


def hub_failure(line: str, repo: str, revision: str, mode: str, have_token: bool, incoming: str) -> str:
    """One sentence for a failed Hub call, from the helper's last stderr line.

    A refusal (HTTP 401/403, a gated or unknown repo) names model_sync_hf_token and what to
    do with it; anything else quotes huggingface_hub's own first line.
    """
    try:
        err = _json().loads(line)
    except ValueError:
        err = None
    if not isinstance(err, dict) or "hub_error" not in err:
        err = {"hub_error": "", "status": None, "message": line}
    kind, status, text = err.get("hub_error") or "", err.get("status"), err.get("message") or "no error output"
    after = ("nothing was downloaded" if mode == "info"
             else f"partial downloads stay in {incoming} and the next run resumes")
    where = f"{repo}@{revision}"
    if kind == "RevisionNotFoundError":
        return f"the Hub has no revision {revision} of {repo}: set model_sync_source.revision to a commit of it; {after}."
    refused = kind in ("GatedRepoError", "RepositoryNotFoundError") or status in (401, 403)
    if refused:
        why = (f"HTTP {status}, " if status else "") + ("a gated repo" if kind == "GatedRepoError"
                                                         else "not found, private or gated")
        if not have_token:
            return (f"the Hub refused {where} ({why}) and model_sync_hf_token is empty: put a token whose account "
                    f"has been granted access to {repo} in model_sync_hf_token (vaulted); {after}.")
        return (f"the Hub refused {where} ({why}) with the token in model_sync_hf_token: grant that token's account "
                f"access to {repo} on the Hub, or use another token; {after}.")
    what = "read the file list of" if mode == "info" else "download"
    return f"huggingface_hub could not {what} {where}: {text[-400:]}; {after}."


def listing(path: str) -> list[dict]:
    """Files of a directory with size and mtime (``model-sync listing``, run on the controller)."""
    return [{"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            for rel, st in sorted(scan(path).items())]


def diff_text(result: dict, dest: str) -> dict:
    """Ansible ``diff`` of a result: the current link before and the plan after."""
    plan = result.get("plan") or {}
    sw = plan.get("switch") or {}
    before = f"current -> {sw.get('from')}\n" if sw else ""
    lines = []
    if plan.get("fetch"):
        lines.append(f"fetch {len(plan['fetch'])} file(s), {plan.get('fetch_bytes', 0)} bytes:")
        lines += [f"  + {f['path']} ({f['size']} bytes)" for f in plan["fetch"]]
    lines += [f"  ~ repair {r['path']} ({r['why']})" for r in plan.get("repair", [])]
    lines += [f"  - remove {r}" for r in plan.get("remove", [])]
    if plan.get("link"):
        lines.append(f"stage revisions/{result.get('revision') or '?'} ({len(plan['link'])} hard links)")
    if sw:
        lines.append(f"current -> {sw.get('to')}")
    lines += [f"  - prune {p}" for p in plan.get("prune", [])]
    return {"before_header": f"{dest} (before)", "after_header": f"{dest} (after)",
            "before": before, "after": "\n".join(lines) + ("\n" if lines else "")}


# --------------------------------------------------------------------------- Ansible face


def run_module() -> None:
    """Entry point when Ansible runs this file as the ``model_sync`` module."""
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", default="sync", choices=["sync", "switch", "prune", "verify", "space"]),
            dest=dict(type="path"),
            path=dict(type="path"),
            source=dict(type="dict", default={}),
            source_listing=dict(type="list", elements="dict", default=[]),
            revision=dict(type="str", default=""),
            state_dir=dict(type="path", default="/var/lib/model-sync"),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
            mode=dict(type="str", default="0644"),
            dir_mode=dict(type="str", default="0755"),
            keep=dict(type="int", default=1),
            protect_paths=dict(type="list", elements="path", default=[]),
            workers=dict(type="int", default=0),
            verify=dict(type="str", default="cached", choices=["cached", "full"]),
            reserve_mib=dict(type="int", default=1024),
            rsync_opts=dict(type="list", elements="str", default=[]),
            ssh_opts=dict(type="list", elements="str", default=[]),
            hub_python=dict(type="path"),
            hf_token=dict(type="str", no_log=True),
            hub_endpoint=dict(type="str", default=""),
            refetch=dict(type="bool", default=True),
        ),
        required_if=[("action", "verify", ["path"]), ("action", "sync", ["dest"]),
                     ("action", "switch", ["dest", "revision"]), ("action", "prune", ["dest"]),
                     ("action", "space", ["dest"])],
        supports_check_mode=True,
    )
    p = module.params
    messages: list[str] = []
    engine = Engine(p["dest"] or p["path"], source=p["source"], revision=p["revision"],
                    state_dir=p["state_dir"], owner=p["owner"], group=p["group"], mode=p["mode"],
                    dir_mode=p["dir_mode"], keep=p["keep"], protect_paths=p["protect_paths"],
                    workers=p["workers"], verify=p["verify"], reserve_mib=p["reserve_mib"],
                    rsync_opts=p["rsync_opts"], ssh_opts=p["ssh_opts"], hub_python=p["hub_python"],
                    hf_token=p["hf_token"], hub_endpoint=p["hub_endpoint"], refetch=p["refetch"], check=module.check_mode,
                    source_listing=p["source_listing"], log=messages.append)
    try:
        action = p["action"]
        if action == "sync":
            result = engine.sync()
        elif action == "switch":
            result = engine.switch(p["revision"])
        elif action == "prune":
            result = engine.prune()
        elif action == "verify":
            result = engine.verify_dir(p["path"])
        else:
            result = engine.space()
    except SyncError as exc:
        module.fail_json(msg=str(exc), plan=engine.plan)
    except OSError as exc:
        module.fail_json(msg=f"model_sync failed on {exc.filename or p['dest']}: {exc.strerror}", plan=engine.plan)
    result["messages"] = messages
    if module._diff:
        result["diff"] = diff_text(result, p["dest"] or p["path"])
    module.exit_json(**result)


# --------------------------------------------------------------------------- command line

CLI_USAGE = """usage: model-sync COMMAND [options]

commands:
  deploy DEST     sync + switch + prune (what the role does, in one go)
  sync DEST       fetch, verify and stage a revision of DEST (= <root>/<name>)
  switch DEST --revision REV   point DEST/current at revisions/REV
  prune DEST      remove revisions beyond --keep (never current or --protect)
  verify PATH     verify a model directory in place (index, sizes, sha256)
  listing PATH    print the files of PATH with size and mtime (JSON)
  manifest PATH   print a sha256sum-style manifest of PATH

options (sync/deploy/switch/prune):
  --source-type mirror|hub|controller_dir   (default mirror)
  --source-path P  --source-host H  --source-user U     mirror (local dir, or rsync over ssh)
  --repo-id R  --hub-revision REV  --hub-python PY  --hub-endpoint URL  --hf-token-stdin   hub
  --revision LABEL   --owner U  --group G  --mode 0644  --dir-mode 0755
  --keep N  --protect PATH (repeatable)  --reserve-mib N
  --rsync-opt OPT  --ssh-opt OPT (repeatable)
common: --state-dir DIR  --workers N  --verify cached|full  --check

Prints one JSON object. Exit 0 = done, 1 = failed (one sentence on stderr), 2 = usage.
"""

# option -> (key, kind); kinds: str, int, flag, list
CLI_OPTIONS: dict[str, tuple[str, str]] = {
    "--source-type": ("source_type", "str"), "--source-path": ("source_path", "str"),
    "--source-host": ("source_host", "str"), "--source-user": ("source_user", "str"),
    "--repo-id": ("repo_id", "str"), "--hub-revision": ("hub_revision", "str"),
    "--hub-python": ("hub_python", "str"), "--hf-token-stdin": ("hf_token_stdin", "flag"),
    "--hub-endpoint": ("hub_endpoint", "str"),
    "--revision": ("revision", "str"), "--owner": ("owner", "str"), "--group": ("group", "str"),
    "--mode": ("mode", "str"), "--dir-mode": ("dir_mode", "str"), "--keep": ("keep", "int"),
    "--protect": ("protect", "list"), "--reserve-mib": ("reserve_mib", "int"),
    "--rsync-opt": ("rsync_opt", "list"), "--ssh-opt": ("ssh_opt", "list"),
    "--state-dir": ("state_dir", "str"), "--workers": ("workers", "int"),
    "--verify": ("verify", "str"), "--check": ("check", "flag"),
}
CLI_COMMANDS = ("deploy", "sync", "switch", "prune", "verify", "listing", "manifest")


class UsageError(Exception):
    """Wrong command line."""


def parse_cli(argv: list[str]) -> tuple[str, str, dict]:
    """Parse ``COMMAND PATH [--option value ...]``.

    Hand-written rather than argparse: argparse (with gettext and re) costs about 10 ms
    of start-up, a third of a no-op sync.
    """
    opts: dict = {"source_type": "mirror", "revision": "", "owner": "root", "group": "root",
                  "mode": "0644", "dir_mode": "0755", "keep": 1, "protect": [], "reserve_mib": 1024,
                  "rsync_opt": [], "ssh_opt": [], "state_dir": "/var/lib/model-sync", "workers": 0,
                  "verify": "cached", "check": False, "hf_token_stdin": False}
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise UsageError("")
        if arg.startswith("--"):
            name, eq, inline = arg.partition("=")
            if name not in CLI_OPTIONS:
                raise UsageError(f"unknown option {name}")
            key, kind = CLI_OPTIONS[name]
            if kind == "flag":
                opts[key] = True
            else:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        raise UsageError(f"{name} needs a value")
                    inline = argv[i]
                if kind == "int":
                    try:
                        opts[key] = int(inline)
                    except ValueError:
                        raise UsageError(f"{name} needs a number, not {inline!r}") from None
                elif kind == "list":
                    opts[key].append(inline)
                else:
                    opts[key] = inline
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 2 or positional[0] not in CLI_COMMANDS:
        raise UsageError("expected COMMAND and one path")
    if opts["verify"] not in ("cached", "full"):
        raise UsageError("--verify is cached or full")
    if opts["source_type"] not in ("mirror", "hub", "controller_dir"):
        raise UsageError("--source-type is mirror, hub or controller_dir")
    return positional[0], positional[1], opts


def cli(argv: list[str] | None = None) -> int:
    """``model-sync`` command line; prints one JSON object; exit 0 ok, 1 failure, 2 usage."""
    t0 = _now()
    try:
        cmd, path, o = parse_cli(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        print(f"{CLI_USAGE}\n{'model-sync: ' + str(exc) if str(exc) else ''}".rstrip(), file=sys.stderr if str(exc) else sys.stdout)
        return 2 if str(exc) else 0
    try:
        if cmd == "listing":
            print(dumps(listing(path)))
            return 0
        if cmd == "manifest":
            files = scan(path)
            todo = [(os.path.join(path, r), st.st_size) for r, st in files.items() if r != MANIFEST_NAME]
            hashes = hash_many(todo, _workers(o["workers"]), Counter())
            prefix = len(path.rstrip("/")) + 1
            for p in sorted(hashes):
                print(f"{hashes[p]}  {p[prefix:]}")
            return 0
        if cmd == "verify":
            engine = Engine(path, state_dir=o["state_dir"], workers=o["workers"], verify=o["verify"],
                            check=o["check"])
            result = engine.verify_dir(path)
        else:
            token = sys.stdin.readline().strip() if o["hf_token_stdin"] else None
            source: dict = {"type": o["source_type"]}
            for key, opt in (("path", "source_path"), ("host", "source_host"), ("user", "source_user"),
                             ("repo_id", "repo_id"), ("revision", "hub_revision")):
                if o.get(opt):
                    source[key] = o[opt]
            engine = Engine(path, source=source, revision=o["revision"], state_dir=o["state_dir"],
                            owner=o["owner"], group=o["group"], mode=o["mode"], dir_mode=o["dir_mode"],
                            keep=o["keep"], protect_paths=o["protect"], workers=o["workers"],
                            verify=o["verify"], reserve_mib=o["reserve_mib"], rsync_opts=o["rsync_opt"],
                            ssh_opts=o["ssh_opt"], hub_python=o.get("hub_python"), hf_token=token,
                            hub_endpoint=o.get("hub_endpoint") or "",
                            check=o["check"], log=lambda m: print(m, file=sys.stderr))
            if cmd == "sync":
                result = engine.sync()
            elif cmd == "switch":
                result = engine.switch(o["revision"])
            elif cmd == "prune":
                result = engine.prune()
            else:
                result = engine.sync()
                if result.get("revision") and not result.get("refetch"):
                    sw = engine.switch(result["revision"])
                    pr = engine.prune()
                    result["changed"] = result["changed"] or sw["changed"] or pr["changed"]
                    result["stats"] = engine.stats(t0)
        result.pop("config", None)
        print(dumps(result))
        return 0
    except SyncError as exc:
        print(dumps({"failed": True, "msg": str(exc)}))
        print(f"model-sync: {exc}", file=sys.stderr)
        return 1


def main() -> None:
    """Run as an Ansible module when AnsiballZ started us (it sets ``_module_fqn``), else as the CLI."""
    if globals().get("_module_fqn"):
        run_module()
    else:
        sys.exit(cli())


if __name__ == "__main__":
    main()
