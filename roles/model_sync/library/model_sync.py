#!/usr/bin/python3
"""model_sync: put a model on a host atomically, resumably, verified (the Ansible module).

The engine is the package ``model_sync_lib``, module_utils of the repository's collection
llm_deploy.inference (AnsiballZ ships it);
this file holds the module's documentation, its argument spec and the dispatch of its
actions. The same engine is the ``model-sync`` command (the role's launcher ``files/model-sync``).
"""

from __future__ import annotations

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
  - The engine (C(model_sync_lib), module_utils of the collection llm_deploy.inference) is also a
    command line program (C(model-sync --help)).
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
      - C(install) puts the engine (this module's C(model_sync_lib) package) under I(dest)
        (C(/usr/local/lib/model-sync)) for the C(model-sync) command, owned by I(owner) and
        I(group) with I(mode) and I(dir_mode); files are rewritten only when they differ.
    type: str
    choices: [sync, switch, prune, verify, space, install]
    default: sync
  dest:
    description:
      - Directory of this model, C(<model_sync_root>/<model_sync_name>).
      - For I(action=install), the directory that receives C(model_sync_lib/).
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
installed:
  description: Engine files written (I(action=install)).
  returned: install
  type: list
removed:
  description: Files of earlier engine versions removed (I(action=install)).
  returned: install
  type: list
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.common import SyncError
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.diff import diff_text
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.engine import ACTIONS, Engine
from ansible_collections.llm_deploy.inference.plugins.module_utils.model_sync_lib.install import install_engine


def run_module() -> None:
    """Run one action of the engine with the task's arguments and report its result."""
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", default="sync", choices=[*ACTIONS, "install"]),
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
        required_if=[
            ("action", "verify", ["path"]),
            ("action", "sync", ["dest"]),
            ("action", "switch", ["dest", "revision"]),
            ("action", "prune", ["dest"]),
            ("action", "space", ["dest"]),
            ("action", "install", ["dest"]),
        ],
        supports_check_mode=True,
    )
    p = module.params
    messages: list[str] = []
    engine = Engine(
        p["dest"] or p["path"],
        source=p["source"],
        revision=p["revision"],
        state_dir=p["state_dir"],
        owner=p["owner"],
        group=p["group"],
        mode=p["mode"],
        dir_mode=p["dir_mode"],
        keep=p["keep"],
        protect_paths=p["protect_paths"],
        workers=p["workers"],
        verify=p["verify"],
        reserve_mib=p["reserve_mib"],
        rsync_opts=p["rsync_opts"],
        ssh_opts=p["ssh_opts"],
        hub_python=p["hub_python"],
        hf_token=p["hf_token"],
        hub_endpoint=p["hub_endpoint"],
        refetch=p["refetch"],
        check=module.check_mode,
        source_listing=p["source_listing"],
        log=messages.append,
    )
    try:
        if p["action"] == "install":
            result = install_engine(engine)
        else:
            result = engine.run(p["action"], p["path"])
    except SyncError as exc:
        module.fail_json(msg=str(exc), plan=engine.plan)
    except OSError as exc:
        module.fail_json(msg=f"model_sync failed on {exc.filename or p['dest']}: {exc.strerror}", plan=engine.plan)
    result["messages"] = messages
    if module._diff:
        result["diff"] = diff_text(result, p["dest"] or p["path"])
    module.exit_json(**result)


def main() -> None:
    """Entry point of the module."""
    run_module()


if __name__ == "__main__":
    main()
