# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Action ``converged_fingerprint``: the inputs of a deploy, as one sha256 per part, on the controller."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# A controller file at most this big enters the fingerprint by its content; a bigger one (a
# wheel, a weight shard) by its size and mtime.
CONTENT_LIMIT = 1 << 20
SKIPPED_NAMES = ("__pycache__",)


def digest(data: Any) -> str:
    """sha256 of the canonical JSON of ``data``."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def file_identity(path: str) -> list:
    """A controller file by content (small) or by size and mtime (big)."""
    st = os.stat(path)
    if st.st_size <= CONTENT_LIMIT:
        with open(path, "rb") as fh:
            return [st.st_size, hashlib.sha256(fh.read()).hexdigest()]
    return [st.st_size, st.st_mtime_ns]


def path_identity(path: str) -> Any:
    """A controller file, or every file under a directory (by relative path); None when missing."""
    if os.path.isfile(path):
        return file_identity(path)
    if not os.path.isdir(path):
        return None
    found = {}
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_NAMES)
        for name in filenames:
            if name.endswith(".pyc"):
                continue
            full = os.path.join(dirpath, name)
            found[os.path.relpath(full, path)] = file_identity(full)
    return found


def role_variables(roles_dir: str, role: str) -> list[str]:
    """The variables a role documents in meta/argument_specs.yml (every entry point)."""
    spec_file = os.path.join(roles_dir, role, "meta", "argument_specs.yml")
    try:
        with open(spec_file, encoding="utf-8") as fh:
            specs = (yaml.safe_load(fh) or {}).get("argument_specs", {})
    except FileNotFoundError as exc:
        raise AnsibleActionFail(
            f"converged_roles names {role}, which has no {spec_file}; name roles of {roles_dir} only."
        ) from exc
    names = set()
    for entry in specs.values():
        names.update((entry or {}).get("options", {}) or {})
    return sorted(names)


class ActionModule(ActionBase):
    """Compute the fingerprint of a deploy's inputs on the controller; the host is not contacted."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        """Return ``fingerprint`` (part name -> sha256; no value, secret or not, leaves this plugin)
        and ``part_roles`` (part name -> the role it belongs to; the other parts are shared)."""
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        roles_dir = args.get("roles_dir")
        if not roles_dir or not os.path.isdir(roles_dir):
            raise AnsibleActionFail(f"roles_dir {roles_dir!r} is not a directory on the controller.")
        ignore = set(args.get("ignore_vars") or [])
        templar = self._templar.copy_with_new_env(available_variables=task_vars)
        fingerprint, part_roles = {}, {}
        for role in args.get("roles") or []:
            values = {}
            for name in role_variables(roles_dir, role):
                if name in ignore:
                    continue
                if name not in task_vars:
                    values[name] = "(not set)"
                    continue
                try:
                    values[name] = templar.template(task_vars[name])
                except Exception as exc:  # noqa: BLE001 - an input that cannot be resolved yet is an input too
                    values[name] = f"(cannot be resolved yet: {type(exc).__name__})"
            for part, value in (
                (f"variables of role {role}", digest(values)),
                (f"files of role {role}", digest(path_identity(os.path.join(roles_dir, role)))),
            ):
                fingerprint[part] = value
                part_roles[part] = role
        for path in args.get("paths") or []:
            if path:
                fingerprint[f"controller path {path}"] = digest(path_identity(path))
        fingerprint["host facts"] = digest(args.get("facts") or {})
        result.update(changed=False, fingerprint=fingerprint, part_roles=part_roles)
        return result
