#!/usr/bin/python
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Ansible module ``health_gate_rules``: the gate's rules applied to the role's variables."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: health_gate_rules
short_description: Check the health gate's variables against the gate's own rules, changing nothing
description:
  - Applies the rules the C(health_gate) module checks its options with (the ranges of
    C(llm_gate.config.RANGE_RULES) and its URL rule) to the role's variables, so a
    threshold that makes no sense is refused before a deploy changes anything on the host,
    by the same rules the gate itself would use later.
  - Returns one sentence per variable that breaks its rule, naming it as O(prefix) plus the
    option's name; it never fails on them itself, so the caller words the refusal.
  - Runs anywhere with Python 3.8 or newer (standard library only); changes nothing, and
    runs the same in check mode.
version_added: "1.0.0"
options:
  values:
    description:
      - The options to check, by the gate's option names (C(requests), C(min_decode_tps), ...),
        with the values as the variables hold them (strings are converted as the gate would).
      - Options not given are not checked; unknown names are refused.
    type: dict
    required: true
  prefix:
    description: What the sentences put before an option's name (the role's variable prefix).
    type: str
    default: ""
author:
  - llm-deploy authors
"""

EXAMPLES = r"""
- name: Check the gate's variables before anything changes
  health_gate_rules:
    prefix: health_gate_
    values:
      url: "{{ health_gate_url }}"
      requests: "{{ health_gate_requests }}"
      min_decode_tps: "{{ health_gate_min_decode_tps }}"
  register: __health_gate_rules
"""

RETURN = r"""
problems:
  description:
    - One sentence per variable that breaks its rule (C(<prefix>requests is 0, but it must be ...)).
    - Empty when all are right.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.llm_gate import DEFAULTS, variable_problems  # noqa: E402


def main() -> None:
    """Check the values, return the sentences."""
    module = AnsibleModule(
        argument_spec=dict(values=dict(type="dict", required=True), prefix=dict(type="str", default="")),
        supports_check_mode=True,
    )
    unknown = sorted(set(module.params["values"]) - set(DEFAULTS))
    if unknown:
        module.fail_json(msg=f"health_gate_rules: unknown gate options: {', '.join(unknown)}")
    module.exit_json(changed=False, problems=variable_problems(module.params["values"], module.params["prefix"]))


if __name__ == "__main__":
    main()
