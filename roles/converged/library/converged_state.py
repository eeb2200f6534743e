#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``converged_state``: the record of a converged deploy, and its check."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converged_state
short_description: Record what a converged deploy left on the host, and tell which roles it can skip
description:
  - The fast path of a deploy, role by role. At the end of a deploy whose roles ran,
    C(state=recorded) writes a JSON record (root, 0600) of the deploy's input fingerprint
    and, for each role, of everything it manages on the host as it is now (the sha256, mode
    and owner of each file, the target of each link, the size, mtime, mode and owner of each
    file of a model tree, the distributions installed in each venv, the service accounts),
    the facts it exported and the roles it runs after.
  - C(state=checked) compares a new fingerprint and the host as it is now with the record,
    in one call and without reading any model weights. A role is skipped when its own inputs
    (the parts that C(part_roles) gives to it) and every path it manages are as recorded
    (and its units, if any, are active and enabled at boot with no pending daemon-reload), and
    no role it C(needs) runs. An input part that belongs to no role of C(roles) is shared, and a
    change there runs every role. C(converged=true) when every role is skipped. When any role
    runs, it lists the C(reasons) and removes the record (not in check mode), so that a deploy
    that then changes the host and fails cannot leave a record behind that no longer describes it.
  - C(state=kept), after the gate passed, keeps a copy of the record beside it (C(<path>.good)),
    the record of the last-known-good state (none when there is no record).
  - C(state=reverted), when a deploy failed and the host goes back to its last-known-good state,
    replaces the record by that copy (or removes it when there is none). The next check verifies
    it against the host like any record, so a rollback that did not complete only makes the
    roles run.
  - C(state=absent) removes the record.
  - Always returns C(changed=false); the record is bookkeeping, not configuration, so a no-op
    deploy stays at changed=0.
  - Secrets never enter the record; the fingerprint holds only sha256 digests, and secret
    files are recorded by their sha256.
  - Each write (the record, its copy and the copy put back) is on disk when the module returns,
    written under a temporary name, fsynced, renamed, and the directory fsynced (role llm_host's
    C(llm_host_lib/durable.py)), so a power cut cannot leave a record that names a state the
    host lost.
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  path:
    description: The record file on the host (its directory is made when missing).
    type: path
    required: true
  state:
    description:
      - C(checked) to compare, C(recorded) to write the record, C(kept) to keep a copy of it as the
        last-known-good state's, C(reverted) to put that copy back, C(absent) to remove the record.
    type: str
    choices: [checked, recorded, kept, reverted, absent]
    default: checked
  fingerprint:
    description:
      - The inputs of the deploy as C(part -> sha256) (see the C(converged_fingerprint) action of
        the C(converged) role). Every part must equal the recorded one.
    type: dict
    default: {}
  part_roles:
    description:
      - The role each input part belongs to (C(part -> role)). A part not named here, or named
        for a role that is not in C(roles), is shared by every role.
    type: dict
    default: {}
  roles:
    description:
      - "What each role leaves on the host, in the order the roles run: C(role -> {files, trees,
        venvs, users, groups, unit, facts, needs}). C(files): paths whose state (sha256, mode,
        owner; or link target, directory, absence) is recorded. C(trees): directories whose
        regular files are recorded by size, mtime, mode and owner (not read). C(venvs): virtual
        environments whose installed distributions (the C(*.dist-info) names) are recorded.
        C(users): accounts (uid, primary gid, home, shell). C(groups): groups (gid). C(unit): the
        systemd units (without C(.service)), a name or a list, that must be active, enabled and need
        no daemon-reload; empty for none. C(facts): the names of the facts the role exports (their values come from
        C(facts)). C(needs): roles whose running makes this role run too."
      - Keys other than these are ignored, so a role's whole C(<role>_converged) mapping can be passed.
    type: dict
    default: {}
  facts:
    description: The values of the facts the roles export (state=recorded), kept in the record by role.
    type: dict
    default: {}
notes:
  - Runs with the same privileges as the deploy (root).
"""

EXAMPLES = r"""
- name: Tell which roles the host is still as the last converged deploy left it for
  converged_state:
    path: /var/lib/inference-server-deploy/converged.json
    fingerprint: {"variables of role ml_env": 9f2c..., "files of role ml_env": 41ab..., "host facts": 07dd...}
    part_roles: {"variables of role ml_env": ml_env, "files of role ml_env": ml_env}
    roles:
      ml_env: {venvs: [/opt/ml-env.d/transformers-cpu-0a1b2c3d4e5f]}
      inference_server: {unit: inference-server, needs: [ml_env]}
  register: __converged

- name: Record what the deploy left on the host
  converged_state:
    path: /var/lib/inference-server-deploy/converged.json
    state: recorded
    fingerprint: "{{ __fingerprint.fingerprint }}"
    part_roles: "{{ __fingerprint.part_roles }}"
    roles:
      ml_env: {files: [/opt/ml-env], venvs: [/opt/ml-env.d/transformers-cpu-0a1b2c3d4e5f], facts: [ml_env_versions]}
      model_sync: {trees: [/srv/models/tiny/revisions/abc123], facts: [model_sync_revision]}
      inference_server: {files: [/etc/systemd/system/inference-server.service], users: [inference],
                         unit: inference-server, needs: [ml_env, model_sync]}
    facts: {ml_env_versions: {torch: 2.9.0}, model_sync_revision: abc123}
"""

RETURN = r"""
converged:
  description: Whether every role is skipped (state=checked).
  returned: state=checked
  type: bool
skip_roles:
  description: The roles whose inputs and managed paths are as recorded, in the order of C(roles).
  returned: state=checked
  type: list
  elements: str
run_roles:
  description: The roles that must run, in the order of C(roles).
  returned: state=checked
  type: list
  elements: str
reasons:
  description: What differs, one sentence each (at most 10); empty when converged.
  returned: state=checked
  type: list
  elements: str
facts:
  description: The facts the skipped roles exported when the record was written.
  returned: state=checked
  type: dict
removed:
  description: Whether a stale record was removed (without a copy to put back, for state=reverted).
  returned: state=checked, state=reverted or state=absent
  type: bool
kept:
  description: Whether there was a record to keep a copy of.
  returned: state=kept
  type: bool
restored:
  description: Whether the last-known-good state's record was put back.
  returned: state=reverted
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
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import durable

RECORD_VERSION = 2
# What a role's entry of the ``roles`` option names on the host.
PATH_KINDS = ("files", "trees", "venvs", "users", "groups")
MAX_REASONS = 10
# The copy of the record of the last-known-good state, beside the record.
GOOD_SUFFIX = ".good"


def path_state(path: str) -> dict:
    """What a managed path is now: absent, a link (target), a directory or a file (sha256). A path under
    a directory that became a link to a file (the service account can do that in its own directories)
    is absent: the host is not as recorded, and the roles that run then refuse the link by name."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
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


def unit_names(entry: dict) -> list[str]:
    """The units of a role's entry: C(unit) as one name or a list ('' or none: no unit)."""
    unit = entry.get("unit") or []
    return [name for name in ([unit] if isinstance(unit, str) else unit) if name]


def take_role(entry: dict, facts: dict) -> dict:
    """The record of one role: the state of what it manages now, its facts and what it needs."""
    return {
        "files": {p: path_state(p) for p in entry.get("files") or []},
        "trees": {t: tree_state(t) for t in entry.get("trees") or []},
        "venvs": {v: venv_state(v) for v in entry.get("venvs") or []},
        "users": {u: user_state(u) for u in entry.get("users") or []},
        "groups": {g: group_state(g) for g in entry.get("groups") or []},
        "unit": unit_names(entry),
        "facts": {name: facts.get(name) for name in entry.get("facts") or []},
    }


def take_record(params: dict) -> dict:
    """The record of the host as it is now, for the given roles and inputs."""
    return {
        "version": RECORD_VERSION,
        "fingerprint": params["fingerprint"],
        "roles": {role: take_role(entry or {}, params["facts"]) for role, entry in params["roles"].items()},
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


def host_differences(entry: dict) -> list[str]:
    """Every way the paths, accounts and unit of one role's record differ from the host now."""
    reasons: list[str] = []
    for path, was in entry.get("files", {}).items():
        now = path_state(path)
        if now != was:
            reasons.append(describe_file_change(path, was, now))
    for root, was in entry.get("trees", {}).items():
        now = tree_state(root)
        if now != was:
            changed = sorted(set(was) ^ set(now) | {f for f in set(was) & set(now) if was[f] != now[f]})
            reasons.append(
                f"{root}: {', '.join(changed[:3])}{' and more' if len(changed) > 3 else ''} changed "
                "(size, mtime, mode or owner)."
            )
    for venv, was in entry.get("venvs", {}).items():
        now = venv_state(venv)
        if now != was:
            gone, new = sorted(set(was) - set(now)), sorted(set(now) - set(was))
            reasons.append(f"The venv {venv} changed: removed {gone or 'nothing'}, added {new or 'nothing'}.")
    for user, was in entry.get("users", {}).items():
        if user_state(user) != was:
            reasons.append(f"The account {user} changed.")
    for group, was in entry.get("groups", {}).items():
        if group_state(group) != was:
            reasons.append(f"The group {group} changed.")
    for unit in unit_names(entry):
        problem = unit_problem(unit)
        if problem:
            reasons.append(problem)
    return reasons


def compare(record: dict, params: dict) -> tuple[list[str], list[str], list[str]]:
    """Which roles can be skipped and which must run, and why: (skipped, running, reasons)."""
    roles = list(params["roles"])
    if record.get("version") != RECORD_VERSION:
        return [], roles, ["The record was written by another version of this check."]
    shared: list[str] = []
    own: dict[str, list[str]] = {role: [] for role in roles}
    was_fp, now_fp = record.get("fingerprint", {}), params["fingerprint"]
    for part in sorted(set(was_fp) | set(now_fp)):
        if was_fp.get(part) != now_fp.get(part):
            owner = params["part_roles"].get(part)
            (own[owner] if owner in own else shared).append(f"The deploy's inputs changed: {part}.")
    recorded_roles = record.get("roles", {})
    for role in roles:
        if role not in recorded_roles:
            own[role].append(f"The record holds nothing of role {role}.")
        elif not shared:
            own[role].extend(host_differences(recorded_roles[role]))
    if shared:
        return [], roles, shared[:MAX_REASONS]
    running = {role for role in roles if own[role]}
    needed: list[str] = []
    grew = True
    while grew:
        grew = False
        for role in roles:
            after = [need for need in (params["roles"][role] or {}).get("needs") or [] if need in running]
            if role not in running and after:
                running.add(role)
                needed.append(f"{role} runs after {' and '.join(after)}.")
                grew = True
    reasons = [reason for role in roles for reason in own[role]] + needed
    return [r for r in roles if r not in running], [r for r in roles if r in running], reasons[:MAX_REASONS]


def write_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole and on disk, readable by root only (its directory is made when missing)."""
    # Root's only when made here (inference_server's account.yml keeps the deploy's directory 0700).
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    durable.replace_file(path, data, 0o600)


def write_record(path: str, record: dict) -> None:
    """Write the record atomically, readable by root only."""
    write_atomically(path, json.dumps(record, sort_keys=True).encode())


def copy_record(source: str, target: str) -> bool:
    """Copy the record ``source`` to ``target`` atomically; False when there is no ``source``."""
    try:
        with open(source, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return False
    write_atomically(target, data)
    return True


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
            "state": {
                "type": "str",
                "choices": ["checked", "recorded", "kept", "reverted", "absent"],
                "default": "checked",
            },
            "fingerprint": {"type": "dict", "default": {}},
            "part_roles": {"type": "dict", "default": {}},
            "roles": {"type": "dict", "default": {}},
            "facts": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params, path = module.params, module.params["path"]
    good = path + GOOD_SUFFIX
    if params["state"] == "absent":
        removed = False if module.check_mode else remove_record(path)
        module.exit_json(changed=False, removed=removed)
    if params["state"] == "kept":
        if module.check_mode:
            module.exit_json(changed=False, kept=os.path.exists(path))
        kept = copy_record(path, good)
        if not kept:
            # Without a record (the fast path off), an older copy would describe an older state.
            remove_record(good)
        module.exit_json(changed=False, kept=kept)
    if params["state"] == "reverted":
        if module.check_mode:
            module.exit_json(changed=False, restored=os.path.exists(good), removed=False)
        restored = copy_record(good, path)
        module.exit_json(changed=False, restored=restored, removed=False if restored else remove_record(path))
    if params["state"] == "recorded":
        record = take_record(params)
        if not module.check_mode:
            write_record(path, record)
        entries = record["roles"].values()
        counts = {kind: sum(len(entry[kind]) for entry in entries) for kind in PATH_KINDS}
        counts["tree_files"] = sum(len(files) for entry in entries for files in entry["trees"].values())
        module.exit_json(changed=False, paths=counts)
    record, missing = read_record(path)
    if missing:
        skipped, running, reasons = [], list(params["roles"]), [missing]
    else:
        skipped, running, reasons = compare(record, params)
    removed = False
    if running and record is not None and not module.check_mode:
        removed = remove_record(path)
    facts = {}
    for role in skipped:
        facts.update(record["roles"][role].get("facts", {}))
    module.exit_json(
        changed=False,
        converged=not running,
        skip_roles=skipped,
        run_roles=running,
        reasons=reasons,
        facts=facts,
        removed=removed,
    )


if __name__ == "__main__":
    main()
