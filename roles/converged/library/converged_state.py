#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``converged_state``: the record of a converged deploy, and its check."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converged_state
short_description: Record what a converged deploy left on the host, and tell whether it is still so
description:
  - The fast path of a no-op deploy. At the end of a deploy whose roles all ran,
    C(state=recorded) writes a JSON record (root, 0600) of the deploy's input fingerprint
    and of everything the roles manage on the host, as it is now (the sha256, mode and owner
    of each file, the target of each link, the size, mtime, mode and owner of each file of a
    model tree, the distributions installed in each venv, the service accounts).
  - C(state=checked) compares a new fingerprint and the host as it is now with the record,
    in one call and without reading any model weights. It answers C(converged=true) only
    when every input and every managed path is as recorded and the unit is active and
    enabled at boot with no pending daemon-reload; otherwise it lists the C(reasons) and
    removes the stale record (not in check mode), so that a deploy that then changes the
    host and fails cannot leave a record behind that no longer describes it.
  - C(state=absent) removes the record (a rollback, a failed deploy).
  - Always returns C(changed=false); the record is bookkeeping, not configuration, so a no-op
    deploy stays at changed=0.
  - Secrets never enter the record; the fingerprint holds only sha256 digests, and secret
    files are recorded by their sha256.
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  path:
    description: The record file on the host (its directory is made when missing).
    type: path
    required: true
  state:
    description: C(checked) to compare, C(recorded) to write the record, C(absent) to remove it.
    type: str
    choices: [checked, recorded, absent]
    default: checked
  fingerprint:
    description:
      - The inputs of the deploy as C(part -> sha256) (see the C(converged_fingerprint) action of
        the C(converged) role). Every part must equal the recorded one.
    type: dict
    default: {}
  files:
    description: Paths whose state (sha256, mode, owner; or link target, directory, absence) is recorded.
    type: list
    elements: path
    default: []
  trees:
    description: Directories whose regular files are recorded by size, mtime, mode and owner (not read).
    type: list
    elements: path
    default: []
  venvs:
    description: Virtual environments whose installed distributions (the C(*.dist-info) names) are recorded.
    type: list
    elements: path
    default: []
  users:
    description: Accounts whose uid, primary gid, home and shell are recorded.
    type: list
    elements: str
    default: []
  groups:
    description: Groups whose gid is recorded.
    type: list
    elements: str
    default: []
  unit:
    description:
      - A systemd unit (without C(.service)) that must be active, enabled and need no daemon-reload
        for the host to count as converged; empty for none.
    type: str
    default: ""
  facts:
    description: Facts the skipped roles would have exported, kept in the record and returned by a converged check.
    type: dict
    default: {}
notes:
  - Runs with the same privileges as the deploy (root).
"""

EXAMPLES = r"""
- name: Tell whether the host is still as the last converged deploy left it
  converged_state:
    path: /var/lib/inference-server-deploy/converged.json
    fingerprint: {vars: 9f2c..., role_files: 41ab...}
    unit: inference-server
  register: __converged

- name: Record what the deploy left on the host
  converged_state:
    path: /var/lib/inference-server-deploy/converged.json
    state: recorded
    fingerprint: "{{ converged_fingerprint }}"
    files: [/etc/systemd/system/inference-server.service, /opt/ml-env]
    trees: [/srv/models/tiny/revisions/abc123]
    venvs: [/opt/ml-env.d/transformers-cpu-0a1b2c3d4e5f]
    users: [inference]
    unit: inference-server
    facts: {model_sync_revision: abc123}
"""

RETURN = r"""
converged:
  description: Whether inputs, managed paths and the unit are all as recorded (state=checked).
  returned: state=checked
  type: bool
reasons:
  description: What differs, one sentence each (at most 10); empty when converged.
  returned: state=checked
  type: list
  elements: str
facts:
  description: The facts kept in the record, when converged.
  returned: state=checked
  type: dict
removed:
  description: Whether a stale record was removed.
  returned: state=checked or state=absent
  type: bool
paths:
  description: How many files, tree files, venvs and accounts the record holds.
  returned: state=recorded
  type: dict
"""

import glob
import grp
import hashlib
import json
import os
import pwd
import stat
import subprocess

from ansible.module_utils.basic import AnsibleModule

RECORD_VERSION = 1
MAX_REASONS = 10


def path_state(path: str) -> dict:
    """What a managed path is now: absent, a link (target), a directory or a file (sha256)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"absent": True}
    meta = {"mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid}
    if stat.S_ISLNK(st.st_mode):
        return {"link": os.readlink(path)}
    if stat.S_ISDIR(st.st_mode):
        return {"dir": True, **meta}
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest(), **meta}


def tree_state(root: str) -> dict:
    """Every regular file under ``root`` by [size, mtime_ns, mode, uid, gid]; no content is read."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            files[os.path.relpath(full, root)] = [
                st.st_size,
                st.st_mtime_ns,
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
            ]
    return files


def venv_state(venv: str) -> list[str]:
    """The distributions installed in a venv, as the sorted names of their ``*.dist-info``."""
    return sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info"))
    )


def user_state(name: str) -> list | None:
    """An account's uid, gid, home and shell, or None when it does not exist."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return [pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell]


def group_state(name: str) -> int | None:
    """A group's gid, or None when it does not exist."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def unit_problem(unit: str) -> str | None:
    """Why the unit does not count as serving its recorded state, or None when it does."""
    try:
        out = subprocess.run(
            [
                "systemctl",
                "show",
                "-p",
                "ActiveState",
                "-p",
                "UnitFileState",
                "-p",
                "NeedDaemonReload",
                f"{unit}.service",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemctl could not tell the state of {unit}: {exc}."
    props = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    if props.get("ActiveState") != "active":
        return f"The unit {unit} is {props.get('ActiveState') or 'unknown'}, not active."
    if props.get("UnitFileState") != "enabled":
        return f"The unit {unit} is {props.get('UnitFileState') or 'unknown'} at boot, not enabled."
    if props.get("NeedDaemonReload") == "yes":
        return f"The unit file of {unit} changed on disk since systemd loaded it."
    return None


def take_record(params: dict) -> dict:
    """The record of the host as it is now, for the given paths and inputs."""
    return {
        "version": RECORD_VERSION,
        "fingerprint": params["fingerprint"],
        "files": {p: path_state(p) for p in params["files"]},
        "trees": {t: tree_state(t) for t in params["trees"]},
        "venvs": {v: venv_state(v) for v in params["venvs"]},
        "users": {u: user_state(u) for u in params["users"]},
        "groups": {g: group_state(g) for g in params["groups"]},
        "unit": params["unit"],
        "facts": params["facts"],
    }


def describe_file_change(path: str, was: dict, now: dict) -> str:
    """One sentence on how a managed path differs from its record."""
    if now.get("absent"):
        return f"{path} is gone."
    if was.get("absent"):
        return f"{path} exists, but the converged deploy had removed it."
    if "link" in was or "link" in now:
        return f"{path} points at {now.get('link', '(not a link)')}, not at {was.get('link', '(not a link)')}."
    if was.get("sha256") != now.get("sha256"):
        return f"{path} was edited (its sha256 changed)."
    return f"{path} changed mode or owner."


def differences(record: dict, params: dict) -> list[str]:
    """Every way the inputs and the host differ from the record (at most MAX_REASONS)."""
    reasons: list[str] = []
    if record.get("version") != RECORD_VERSION:
        return ["The record was written by another version of this check."]
    was_fp, now_fp = record.get("fingerprint", {}), params["fingerprint"]
    for part in sorted(set(was_fp) | set(now_fp)):
        if was_fp.get(part) != now_fp.get(part):
            reasons.append(f"The deploy's inputs changed: {part}.")
    for path, was in record.get("files", {}).items():
        now = path_state(path)
        if now != was:
            reasons.append(describe_file_change(path, was, now))
    for root, was in record.get("trees", {}).items():
        now = tree_state(root)
        if now != was:
            changed = sorted(set(was) ^ set(now) | {f for f in set(was) & set(now) if was[f] != now[f]})
            reasons.append(
                f"{root}: {', '.join(changed[:3])}{' and more' if len(changed) > 3 else ''} changed "
                "(size, mtime, mode or owner)."
            )
    for venv, was in record.get("venvs", {}).items():
        now = venv_state(venv)
        if now != was:
            gone, new = sorted(set(was) - set(now)), sorted(set(now) - set(was))
            reasons.append(f"The venv {venv} changed: removed {gone or 'nothing'}, added {new or 'nothing'}.")
    for user, was in record.get("users", {}).items():
        if user_state(user) != was:
            reasons.append(f"The account {user} changed.")
    for group, was in record.get("groups", {}).items():
        if group_state(group) != was:
            reasons.append(f"The group {group} changed.")
    if record.get("unit"):
        problem = unit_problem(record["unit"])
        if problem:
            reasons.append(problem)
    return reasons[:MAX_REASONS]


def write_record(path: str, record: dict) -> None:
    """Write the record atomically, readable by root only (its directory is made when missing)."""
    # Root's only when made here (inference_server's account.yml keeps the deploy's directory 0700).
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    # One writer at a time (the deploy lock): a fixed temporary name, rename(2) publishes it whole.
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)
        json.dump(record, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_record(path: str) -> bool:
    """Remove the record; True when there was one."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def read_record(path: str) -> tuple[dict | None, str | None]:
    """The record, or None with the reason there is none usable."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh), None
    except FileNotFoundError:
        return None, f"No converged deploy is on record ({path} does not exist)."
    except (OSError, ValueError) as exc:
        return None, f"The record {path} cannot be read: {exc}."


def main() -> None:
    """Entry point of the module."""
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["checked", "recorded", "absent"], "default": "checked"},
            "fingerprint": {"type": "dict", "default": {}},
            "files": {"type": "list", "elements": "path", "default": []},
            "trees": {"type": "list", "elements": "path", "default": []},
            "venvs": {"type": "list", "elements": "path", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "groups": {"type": "list", "elements": "str", "default": []},
            "unit": {"type": "str", "default": ""},
            "facts": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params, path = module.params, module.params["path"]
    if params["state"] == "absent":
        removed = False if module.check_mode else remove_record(path)
        module.exit_json(changed=False, removed=removed)
    if params["state"] == "recorded":
        record = take_record(params)
        if not module.check_mode:
            write_record(path, record)
        counts = {kind: len(record[kind]) for kind in ("files", "trees", "venvs", "users", "groups")}
        counts["tree_files"] = sum(len(files) for files in record["trees"].values())
        module.exit_json(changed=False, paths=counts)
    record, missing = read_record(path)
    reasons = [missing] if missing else differences(record, params)
    removed = False
    if reasons and record is not None and not module.check_mode:
        removed = remove_record(path)
    module.exit_json(
        changed=False,
        converged=not reasons,
        reasons=reasons,
        facts=record.get("facts", {}) if record and not reasons else {},
        removed=removed,
    )


if __name__ == "__main__":
    main()
