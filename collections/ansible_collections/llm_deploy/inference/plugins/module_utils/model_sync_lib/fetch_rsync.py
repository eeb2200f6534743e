"""Fetcher of an rsync mirror over SSH: rsync transfers, files are hashed as rsync completes them."""

from __future__ import annotations

import os

from .common import INCOMING, RSYNC_PARTIAL, SyncError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing pulls in re (start-up time)
if TYPE_CHECKING:
    from .base import EngineBase

CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"


def _rsync_base(eng: EngineBase, control_dir: str) -> list[str]:
    """rsync argv common to the dry run and the transfer.

    ssh shares one connection between the two (ControlMaster), and prefers AES-GCM,
    which costs far less CPU than chacha20 where the CPU has AES instructions, leaving
    cycles for hashing the files as they arrive. ``model_sync_ssh_opts`` come first and
    so win over these defaults.
    """
    import shlex

    ssh = (
        ["ssh"]
        + eng.ssh_opts
        + ["-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/%C"]
        + ["-o", "ControlPersist=60", "-o", f"Ciphers={CIPHERS}"]
    )
    return [
        "rsync",
        "-rlt",
        "--delete",
        f"--partial-dir={RSYNC_PARTIAL}",
        "-e",
        " ".join(shlex.quote(a) for a in ssh),
    ] + eng.rsync_opts


def _login(eng: EngineBase) -> str:
    """``[user@]host`` of the mirror."""
    user = eng.source.get("user")
    return f"{user + '@' if user else ''}{eng.source['host']}"


def _remote(eng: EngineBase) -> str:
    """rsync's address of the mirror directory."""
    return f"{_login(eng)}:{eng.source['path'].rstrip('/')}/"


def fetch_ssh(eng: EngineBase) -> None:
    """Pull from an rsync mirror over SSH into .incoming; hash files as rsync completes them."""
    import shutil
    import subprocess
    import tempfile

    control_dir = tempfile.mkdtemp(prefix="model-sync-ssh.")
    try:
        _fetch_ssh(eng, control_dir)
    finally:
        subprocess.run(
            ["ssh"] + eng.ssh_opts + ["-o", f"ControlPath={control_dir}/%C", "-O", "exit", _login(eng)],
            capture_output=True,
        )
        shutil.rmtree(control_dir, ignore_errors=True)


def _dry_run(eng: EngineBase, control_dir: str) -> dict[str, dict]:
    """What rsync would move (for the plan and the disk check); records deletions in the plan."""
    import subprocess

    argv = _rsync_base(eng, control_dir) + ["--dry-run", "--out-format=%i %l %n", _remote(eng), eng.incoming + "/"]
    if not os.path.isdir(eng.incoming):
        os.mkdir(os.path.join(control_dir, "empty"))
        argv[-1] = os.path.join(control_dir, "empty") + "/"
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SyncError(f"rsync could not list {_remote(eng)} (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    pending: dict[str, dict] = {}
    for line in proc.stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0][:2] in (">f", "<f") and not parts[2].endswith("/"):
            if "+" in parts[0] or "s" in parts[0][2:] or "t" in parts[0][2:] or "c" in parts[0][2:]:
                pending[parts[2]] = {"size": int(parts[1])}
        elif line.startswith("*deleting"):  # "*deleting   0 name": the name is the third field
            eng.plan["remove"].append(f"{INCOMING}/{line[len('*deleting') :].lstrip().split(' ', 1)[-1]}")
    return pending


def _fetch_ssh(eng: EngineBase, control_dir: str) -> None:
    """Body of :func:`fetch_ssh` with the ssh control socket directory."""
    import subprocess
    import tempfile

    # Dry run first: what would move, for the plan and the disk check.
    pending = _dry_run(eng, control_dir)
    eng.plan_fetch(pending)
    eng.check_space(eng.plan["fetch_bytes"])
    if eng.check or (not pending and not eng.plan["remove"]):
        return
    eng.makedirs(eng.incoming)
    from concurrent.futures import ThreadPoolExecutor

    # rsync names a file (%n) when its data has arrived, just before renaming it into
    # place; once it names the next one, the previous file is in place and is hashed
    # while rsync goes on. The hash is cached under the inode it read, so an early or
    # stale read can never stand for the new file.
    argv = _rsync_base(eng, control_dir) + ["--out-format=%n", _remote(eng), eng.incoming + "/"]
    pool = ThreadPoolExecutor(max_workers=max(1, eng.workers - 1))
    futures = {}

    with tempfile.TemporaryFile(mode="w+") as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, text=True)
        previous = None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if previous in pending and previous not in futures:
                    futures[previous] = pool.submit(eng.hash_incoming, previous)
                previous = line.rstrip("\n")
            rc = proc.wait()
        except BaseException:
            proc.kill()
            raise
        errors.seek(0)
        err = errors.read()
    if rc != 0:
        pool.shutdown(wait=False, cancel_futures=True)
        raise SyncError(
            f"rsync from {_remote(eng)} failed (exit {rc}); the partial transfer is kept in "
            f"{eng.incoming} and the next run resumes: {err.strip()[-400:]}"
        )
    if previous in pending and previous not in futures:
        futures[previous] = pool.submit(eng.hash_incoming, previous)
    for fut in futures.values():
        fut.result()
    pool.shutdown()
    eng.counter.add("bytes_fetched", eng.plan["fetch_bytes"])
    eng.changed = True
