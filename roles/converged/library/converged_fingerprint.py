#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Documentation of the action ``converged_fingerprint`` (its code: ../action_plugins/converged_fingerprint.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converged_fingerprint
short_description: Fingerprint a deploy's inputs on the controller, one sha256 per part
description:
  - An action that runs on the controller only; the host is not contacted.
  - "For each role of O(roles): C(variables of role <role>), the sha256 of the values of every
    variable its C(meta/argument_specs.yml) documents (any entry point), templated as the
    play sees them (a value that cannot be resolved yet counts as such, the same way every
    run), and C(files of role <role>), the sha256 of every file under the role."
  - C(controller path <path>) for each of O(paths) (files up to 1 MiB by content, bigger ones
    by size and mtime; a missing path counts as missing), and C(host facts), the sha256 of O(facts).
  - Only digests leave the plugin, so secret values are never printed, even at C(-vvvv).
version_added: "1.0.0"
author:
  - llm-deploy authors
options:
  roles_dir:
    description: The directory holding the roles.
    type: path
    required: true
  roles:
    description: Roles whose documented variables and files are inputs.
    type: list
    elements: str
    default: []
  ignore_vars:
    description: Documented variables that are not inputs.
    type: list
    elements: str
    default: []
  paths:
    description: Controller files and directories that are inputs.
    type: list
    elements: path
    default: []
  facts:
    description: Host facts that are inputs.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Fingerprint the deploy's inputs on the controller
  converged_fingerprint:
    roles_dir: "{{ playbook_dir }}/roles"
    roles: [ml_env, model_sync, inference_server]
    paths: ["{{ playbook_dir }}/filter_plugins"]
    facts: {gpus: "{{ preflight_gpus }}"}
  register: __fingerprint
"""

RETURN = r"""
fingerprint:
  description: Part name -> sha256 hex digest.
  returned: always
  type: dict
part_roles:
  description:
    - Part name -> the role of C(roles) it belongs to (its variables and its files); the other
      parts (controller paths, host facts) are shared by every role.
  returned: always
  type: dict
"""
