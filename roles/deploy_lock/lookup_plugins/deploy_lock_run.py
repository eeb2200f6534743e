# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Lookup ``deploy_lock_run``: who is deploying, seen from the controller, and whether a run is alive."""

from __future__ import annotations

DOCUMENTATION = r"""
name: deploy_lock_run
short_description: The identity of this ansible-playbook run, or whether another run is still alive
description:
  - Without terms, returns this run's identity on the controller, used as the holder of the
    host's deploy lock - C(controller) (host name), C(controller_boot_id), C(pid) and
    C(pid_start) of the ansible-playbook process (the outermost ancestor of this process
    running the same command line; Ansible's workers are forks of it), C(user) and C(run_id)
    (C(<controller>:<boot id[:8]>:<pid>:<pid_start>)).
  - With the terms C(alive), a holder mapping (as returned without terms), returns whether
    that run is still alive on this controller - C(true) when it ran on another controller
    (it cannot be checked from here), C(false) when this controller has rebooted since or the
    process is gone or is another process that reuses its pid.
options:
  _terms:
    description: Nothing, or C(alive) followed by a holder mapping.
"""

EXAMPLES = r"""
- name: Know who is deploying
  ansible.builtin.set_fact:
    _deploy_lock_owner: "{{ lookup('deploy_lock_run') }}"

- name: Ask whether the holder still runs
  ansible.builtin.debug:
    msg: "{{ lookup('deploy_lock_run', 'alive', holder) }}"
"""

RETURN = r"""
_raw:
  description: One mapping (identity) or one boolean (alive).
  type: raw
"""

import getpass
import os
import socket
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase


def _read(path: str) -> bytes | None:
    """A /proc file's bytes, None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def boot_id() -> str:
    """This machine's boot id (changes at every boot)."""
    return (_read("/proc/sys/kernel/random/boot_id") or b"unknown").decode().strip()


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    raw = _read(f"/proc/{pid:d}/stat")
    if raw is None:
        return None
    return raw.decode(errors="replace").rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def parent(pid: int) -> int | None:
    """The parent pid of a process (field 4 of /proc/<pid>/stat)."""
    fields = stat_fields(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def playbook_pid(pid: int | None = None) -> int:
    """The outermost ancestor of ``pid`` (default: this process) running the same command line.

    Ansible's worker processes are forks of the ansible-playbook process, so they share its
    command line; the parent of the outermost one (a shell, cron, ansible-runner) does not.
    """
    pid = os.getpid() if pid is None else pid
    cmdline = _read(f"/proc/{pid:d}/cmdline")
    while True:
        up = parent(pid)
        if not up or up <= 1 or _read(f"/proc/{up:d}/cmdline") != cmdline:
            return pid
        pid = up


def identity() -> dict[str, Any]:
    """This run's identity as the holder of a host's deploy lock."""
    pid = playbook_pid()
    controller = socket.gethostname()
    boot = boot_id()
    started = start_time(pid) or 0
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {
        "controller": controller,
        "controller_boot_id": boot,
        "pid": pid,
        "pid_start": started,
        "user": user,
        "run_id": f"{controller}:{boot[:8]}:{pid:d}:{started:d}",
    }


def alive(holder: Mapping[str, Any]) -> bool:
    """Whether the run that holds a lock still runs (true when it cannot be told from here)."""
    if holder.get("controller") != socket.gethostname():
        return True
    if holder.get("controller_boot_id") and holder.get("controller_boot_id") != boot_id():
        return False
    try:
        pid, started = int(holder.get("pid") or 0), int(holder.get("pid_start") or 0)
    except (TypeError, ValueError):
        return True
    if pid <= 0:
        return True
    return start_time(pid) == started


class LookupModule(LookupBase):
    """``lookup('deploy_lock_run')`` and ``lookup('deploy_lock_run', 'alive', holder)``."""

    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[Any]:
        """Return [identity] or [alive]."""
        if not terms:
            return [identity()]
        if terms[0] == "alive" and len(terms) == 2 and isinstance(terms[1], Mapping):
            return [alive(terms[1])]
        raise AnsibleLookupError("deploy_lock_run takes no terms, or 'alive' and a holder mapping")
