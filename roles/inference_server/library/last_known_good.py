#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``last_known_good``: record the deployed state as last-known-good, whole."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: last_known_good
short_description: Record the server's unit, its inputs and its state as last-known-good, in one exchange
description:
  - "Writes the whole record aside, into O(staged_dir) (cleared first, root-only): a copy of each
    of O(files) that exists (mode 0600, owner root) and C(state.json), O(state) as JSON. Then
    flushes it to disk and exchanges it with O(dir) in one C(renameat2) with C(RENAME_EXCHANGE): a
    reader, a rollback or a deploy killed at any instant finds the whole old record or the
    whole new one in O(dir), never a mixture. The directory that holds O(dir) is fsynced after
    the exchange, so a power cut after the module returned keeps the new record (each file and
    the staged directory were fsynced before; the steps are role llm_host's
    C(llm_host_lib/durable.py)). The old record is then removed. A first record is a plain
    rename; a file system without the exchange gets two renames (the old record stays at
    C(<dir>.old) if killed between them)."
  - When the staged record holds exactly what O(dir) holds, the staged copy is removed and
    nothing changes (a no-op deploy stays at changed=0).
  - One module run instead of a task per file, for every deploy that passed its gate.
  - File contents are never returned or logged (some are secrets); in check mode nothing is
    written and C(changed) says whether the record would change.
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  dir:
    description: The live record's directory.
    type: path
    required: true
  staged_dir:
    description: Where the next record is written before the exchange (beside O(dir)).
    type: path
    required: true
  files:
    description:
      - "The files to keep, as the role lists the unit's inputs (other keys are ignored): each
        C(path) on the host and C(lkg_name), its name in the record. One whose C(absent) is
        C(remove) (an input this deploy may have removed) is left out when it is missing, so
        the record forgets it; any other one that is missing fails the module before anything
        is written."
    type: list
    elements: dict
    required: true
  state:
    description: What the state consists of, written as C(state.json) (sorted keys, indented).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Record the last-known-good state
  last_known_good:
    dir: /var/lib/inference-server-deploy/last-known-good
    staged_dir: /var/lib/inference-server-deploy/last-known-good.staged
    files:
      - {path: /etc/systemd/system/inference-server.service, lkg_name: unit.service, absent: keep}
      - {path: /etc/inference-server/api-key.yaml, lkg_name: api-key.yaml, absent: remove}
    state: {engine: sglang}
"""

RETURN = r"""
names:
  description: The names of the files the record holds now (C(state.json) included).
  returned: always
  type: list
  elements: str
"""

import errno  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib import durable  # noqa: E402

STATE_NAME = "state.json"


def contents(path: str) -> dict[str, bytes]:
    """Every file of the directory ``path`` (flat), by name."""
    return {name: Path(path, name).read_bytes() for name in sorted(os.listdir(path))}


def record_contents(files: list[dict[str, Any]], state: dict[str, Any]) -> dict[str, bytes]:
    """The record's files by name: each of ``files`` that exists, and ``state`` as state.json.

    Raises FileNotFoundError for a missing file that may not be (``absent`` other than remove)."""
    wanted: dict[str, bytes] = {}
    for entry in files:
        try:
            wanted[entry["lkg_name"]] = Path(entry["path"]).read_bytes()
        except FileNotFoundError:
            if entry.get("absent") != "remove":
                raise
    wanted[STATE_NAME] = (json.dumps(state, indent=4, sort_keys=True, separators=(",", ": ")) + "\n").encode()
    return wanted


def stage(staged: str, wanted: dict[str, bytes]) -> None:
    """Write ``wanted`` (name -> bytes) into a fresh root-only directory ``staged``, each file on disk."""
    shutil.rmtree(staged, ignore_errors=True)
    os.mkdir(staged, 0o700)
    os.chmod(staged, 0o700)
    for name, data in wanted.items():
        durable.write_new(os.path.join(staged, name), data, 0o600)
    if os.geteuid() == 0:
        for name in [".", *wanted]:
            os.chown(os.path.join(staged, name), 0, 0)


def commit(staged: str, live: str) -> bool:
    """Make ``staged`` the record at ``live``, on disk when this returns; True when that changed ``live``."""
    if os.path.isdir(live) and contents(staged) == contents(live):
        shutil.rmtree(staged)
        return False
    durable.fsync_path(staged)  # the names in it (stage fsynced each file)
    if not os.path.lexists(live):
        durable.publish(staged, live)
        return True
    try:
        durable.exchange(staged, live)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        # A file system without RENAME_EXCHANGE: two renames, LIVE missing between them
        # (a rollback then finds no record and says so; the record is at LIVE.old).
        os.rename(live, f"{live}.old")
        os.rename(staged, live)
        staged = f"{live}.old"
    durable.fsync_path(os.path.dirname(os.path.abspath(live)))
    shutil.rmtree(staged)
    return True


def main() -> None:
    """Entry point."""
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", required=True),
            staged_dir=dict(type="path", required=True),
            files=dict(type="list", elements="dict", required=True),
            state=dict(type="dict", required=True),
        ),
        supports_check_mode=True,
    )
    live, staged = module.params["dir"], module.params["staged_dir"]
    try:
        wanted = record_contents(module.params["files"], module.params["state"])
    except FileNotFoundError as exc:
        module.fail_json(msg=f"last_known_good: {exc.filename} is missing, so the deployed state cannot be recorded.")
        return
    if module.check_mode:
        same = os.path.isdir(live) and contents(live) == wanted
        module.exit_json(changed=not same, names=sorted(wanted))
    try:
        stage(staged, wanted)
        changed = commit(staged, live)
    except OSError as exc:
        module.fail_json(msg=f"last_known_good: cannot write the record {live}: {exc}")
        return
    module.exit_json(changed=changed, names=sorted(wanted))


if __name__ == "__main__":
    main()
