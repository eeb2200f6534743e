#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``deploy_lock``: one deploy at a time on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deploy_lock
short_description: Take or release the host's deploy lock (one deploy at a time per host)
description:
  - The lock is a small JSON file on the host naming its holder (controller host, its boot id,
    the ansible-playbook pid and that process's start time, user, run id, when it was taken).
    Every read-modify-write of it happens under an C(flock) on C(<path>.guard), so two
    deploys that start in the same instant cannot both get it.
  - C(state=acquired) takes a free lock, re-takes one this run already holds, and takes over
    a lock older than O(stale_after_s) or one whose holder the controller found gone
    (O(takeover_run_id)). A lock held by another live run is not taken; the module then
    returns C(acquired=false) and the holder, and the role fails with one sentence.
  - C(state=released) removes the lock when this run holds it; a lock held by another run is
    left alone (reported as C(released=false)).
  - Always returns C(changed=false); a lock is bookkeeping, not configuration, so a no-op
    deploy stays at changed=0. In check mode the lock is read but never written.
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  path:
    description:
      - >-
        The lock file on the host. Its directory is created (0700) when missing, and refused when it is
        a link, not root's, or writable by its group or others (C(/run/lock) is 1777), since whoever can
        write there could plant a link at the guard, forge a lock that refuses every deploy, or date one
        in the future so that the watchdog skips for ever.
    type: path
    required: true
  state:
    description: C(acquired) to take the lock, C(released) to give it back.
    type: str
    choices: [acquired, released]
    default: acquired
  owner:
    description:
      - Who takes the lock; C(run_id) is required and identifies the run. The role fills it
        from the controller (C(controller), C(controller_boot_id), C(pid), C(pid_start), C(user)).
    type: dict
    required: true
  stale_after_s:
    description: A lock held longer than this is taken over (with a warning). 0 never expires a lock.
    type: int
    default: 21600
  takeover_run_id:
    description: Take over the lock if (and only if) this run still holds it; the controller found that run gone.
    type: str
  takeover_reason:
    description: Why the holder of O(takeover_run_id) is gone, for the warning.
    type: str
"""

EXAMPLES = r"""
- name: Take the deploy lock on the host
  deploy_lock:
    path: /run/llm-deploy/deploy.lock
    owner: {run_id: "ctl:4242:123456", controller: ctl, pid: 4242, pid_start: 123456, user: ops}
  register: __deploy_lock

- name: Give the deploy lock back
  deploy_lock:
    path: /run/llm-deploy/deploy.lock
    state: released
    owner: {run_id: "ctl:4242:123456"}
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (state=acquired).
  returned: state=acquired
  type: bool
holder:
  description: The lock's content when another run holds it (with C(age_s), seconds since it was taken).
  returned: when another run holds the lock
  type: dict
took_over:
  description: The previous holder when the lock was taken over, with C(reason).
  returned: when a stale lock was taken over
  type: dict
released:
  description: Whether the lock was removed (state=released).
  returned: state=released
  type: bool
"""

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


class LockPlaceError(Exception):
    """The lock's directory is one that another user could write to."""


def private_directory(directory: str) -> None:
    """Create ``directory`` (0700) when missing; raise :class:`LockPlaceError` when it is a link, not a
    directory, not this (root) user's, or writable by its group or others."""
    os.makedirs(os.path.dirname(directory.rstrip("/")) or "/", mode=0o755, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise LockPlaceError(
            f"the deploy lock's directory {directory} is not a directory (a link or a file): set deploy_lock_path "
            "to a file in a directory only root can write, such as the default /run/llm-deploy/deploy.lock"
        )
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise LockPlaceError(
            f"the deploy lock's directory {directory} (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}) is "
            "writable by another user, who could plant a link at the lock, forge one that refuses every deploy, or "
            "date one in the future so that the watchdog skips for ever: set deploy_lock_path to a file in a "
            "directory only root can write, such as the default /run/llm-deploy/deploy.lock"
        )


@contextlib.contextmanager
def guarded(path: str) -> Iterator[None]:
    """Hold an exclusive flock on ``<path>.guard`` while the lock file is read and written (its directory
    checked first: :func:`private_directory`)."""
    private_directory(os.path.dirname(os.path.abspath(path)))
    fd = os.open(path + ".guard", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_lock(path: str) -> dict[str, Any] | None:
    """The lock's content; None when there is no lock. Unreadable content counts as a lock
    of unknown holder taken when the file was last modified."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or "run_id" not in data:
            raise ValueError("not a lock record")
    except ValueError:
        data = {"run_id": "unknown", "controller": "unknown", "note": "unreadable lock file"}
    data.setdefault("acquired_at", stat.st_mtime)
    return data


def write_lock(path: str, record: dict[str, Any]) -> None:
    """Write the lock atomically (temporary file + rename), root-only."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".deploy-lock.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, 0o600)  # root's: it names the controller, the user and the run
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def acquire(
    path: str,
    owner: dict[str, Any],
    stale_after_s: int,
    takeover_run_id: str | None,
    takeover_reason: str | None,
    check: bool,
    now: float | None = None,
) -> dict[str, Any]:
    """Take the lock if it is free, ours, stale, or held by a run the controller found gone."""
    now = time.time() if now is None else now
    record = dict(owner)
    record["acquired_at"] = now
    record["acquired_at_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    with guarded(path):
        held = read_lock(path)
        took_over = None
        if held is not None and held.get("run_id") != owner["run_id"]:
            age = max(0.0, now - float(held.get("acquired_at") or now))
            holder = dict(held, age_s=round(age, 1))
            if takeover_run_id and held.get("run_id") == takeover_run_id:
                took_over = dict(holder, reason=takeover_reason or "its run is gone")
            elif stale_after_s > 0 and age > stale_after_s:
                took_over = dict(
                    holder,
                    reason=f"it is {int(age):d} s old, more than deploy_lock_stale_after_s {int(stale_after_s):d}",
                )
            else:
                return {"acquired": False, "holder": holder}
        elif held is not None:
            record["acquired_at"] = held.get("acquired_at", now)
            record["acquired_at_utc"] = held.get("acquired_at_utc", record["acquired_at_utc"])
        if not check:
            write_lock(path, record)
        result: dict[str, Any] = {"acquired": True, "lock": record}
        if took_over is not None:
            result["took_over"] = took_over
        return result


def release(path: str, run_id: str, check: bool) -> tuple[bool, dict[str, Any] | None]:
    """Remove the lock if this run holds it; (released, the other holder if any)."""
    with guarded(path):
        held = read_lock(path)
        if held is None:
            return False, None
        if held.get("run_id") != run_id:
            return False, held
        if not check:
            os.unlink(path)
        return True, None


def main() -> None:
    """Entry point."""
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="acquired", choices=["acquired", "released"]),
            owner=dict(type="dict", required=True),
            stale_after_s=dict(type="int", default=21600),
            takeover_run_id=dict(type="str"),
            takeover_reason=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    run_id = str(params["owner"].get("run_id") or "")
    if not run_id:
        module.fail_json(msg="deploy_lock: owner.run_id is empty; the role fills it from the controller.")
    try:
        if params["state"] == "released":
            released, other = release(params["path"], run_id, module.check_mode)
            result: dict[str, Any] = {"changed": False, "released": released}
            if other is not None:
                result["holder"] = other
            module.exit_json(**result)
        result = acquire(
            params["path"],
            params["owner"],
            params["stale_after_s"],
            params["takeover_run_id"],
            params["takeover_reason"],
            module.check_mode,
        )
    except LockPlaceError as exc:
        module.fail_json(msg=str(exc) + ".")
        return
    except OSError as exc:
        module.fail_json(msg="deploy_lock: cannot use the lock {}: {}".format(params["path"], exc))
        return
    if "took_over" in result:
        old = result["took_over"]
        module.warn(
            "Took over the deploy lock {} from run {} (controller {}, pid {}, taken {}): {}.".format(
                params["path"],
                old.get("run_id"),
                old.get("controller"),
                old.get("pid"),
                old.get("acquired_at_utc", "at an unknown time"),
                old.get("reason"),
            )
        )
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
