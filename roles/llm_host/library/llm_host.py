#!/usr/bin/python3
"""llm_host: the deploy's host helper as an Ansible module (host facts, a server started by hand).

The code is the package ``llm_host_lib``, module_utils of the repository's collection
llm_deploy.inference (AnsiballZ ships it, and its docstrings document each subcommand); this file
holds the module's documentation, its argument spec and the dispatch of its commands. The same
package is the ``llm-host`` command line and the unit's port guard (this role's launcher
``files/llm-host``).
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_host
short_description: Read the host; find, keep, stop or restore a server run by hand; restart ours; make its directories
description:
  - Runs one subcommand of the deploy's host helper (the package C(llm_host_lib), module_utils of
    the repository's collection llm_deploy.inference) and returns its JSON object as C(host).
  - Standard library only, run by the host's python3. The same package is the command line
    C(llm-host SUBCOMMAND ...) and the unit's port guard (C(port-guard PORT UNIT [GRACE_S])), both
    through role llm_host's launcher C(files/llm-host).
options:
  command:
    description:
      - C(facts) (role preflight) reads glibc, the GPUs and who may open their device nodes, who
        listens on the server's port, the last-known-good record, whether systemd booted the host
        and what is at given paths (C(llm_host_lib/facts.py) documents its arguments and keys).
      - C(inspect), C(record), C(restore), C(switch) and C(alive) (role adopt) find a server started
        by hand, keep what it takes to start it again, put it back, stop it and switch the venv
        link, or tell whether it still runs. Secret-looking values never leave the host (masked as
        ***). C(llm_host_lib/adopt.py) documents their arguments and keys.
      - C(restart) (role inference_server), with I(args) C(UNIT STOP_TIMEOUT_S [--start]
        [--clear-start-limit] [--daemon-reload] [--ready START_TIMEOUT_S]), is the one restart
        sequence of the server's unit, which the watchdog runs on the host too. It reloads systemd
        and clears the start limit when asked, runs C(restart --no-block) and waits until the old
        server drained and the new one started; it fails with one sentence when the new start
        does not come within STOP_TIMEOUT_S + 30 s (C(llm_host_lib/restart.py) documents it).
      - C(install) (role inference_server), with I(args) C(DIR FILE...), puts the named files of
        the package (C(__init__.py), C(guard.py), ...) into
        C(DIR/ansible_collections/llm_deploy/inference/plugins/module_utils/llm_host_lib/) (its
        import name as a path; an earlier version's C(DIR/llm_host_lib/) is removed) for the port
        guard, whose launcher goes in C(DIR), and for the watchdog (C(llm_host_lib/install.py)
        documents how).
      - C(service-dirs) (role inference_server), with I(args) C(USER GROUP VAR=PATH...), makes each
        C(PATH) a directory of C(USER:GROUP), mode 0750, following no symbolic link inside a
        directory others than root can write, and hands over what another account left there
        without following links; a link or a file where a directory must be is refused with a
        sentence naming the path and C(VAR), returned as C(host.refused), before anything changes
        (C(llm_host_lib/service_dirs.py) documents how).
    type: str
    required: true
    choices: [facts, inspect, record, restore, switch, alive, restart, install, service-dirs]
  args:
    description: The subcommand's arguments, as on its command line.
    type: list
    elements: str
    default: []
notes:
  - Check mode runs C(facts), C(inspect) and C(alive) (they change nothing), C(install) and
    C(service-dirs) (which then change nothing and say what they would, a refusal included), and
    skips the others (C(restart) too), returning C(changed=true) and an empty C(host).
author: llm-deploy
"""

EXAMPLES = r"""
- name: Read the host facts of a deploy
  llm_host:
    command: facts
    args: ["8000", /var/lib/inference-server/deployed.json, --path, /opt/ml-env]
  register: host_facts

- name: Find the server that runs by hand on port 8000
  llm_host:
    command: inspect
    args: ["8000", inference-server]
  register: by_hand

- name: Restart the server, letting the old one finish its requests in flight
  llm_host:
    command: restart
    args: [inference-server, "150", --clear-start-limit, --daemon-reload]
  register: restarted

- name: Install the port guard's modules
  llm_host:
    command: install
    args: [/usr/local/lib/inference-server, __init__.py, cli.py, guard.py, proc.py]

- name: Make the service account's directories without following a link it could have put there
  llm_host:
    command: service-dirs
    args: [inference, inference, inference_server_cache_dir=/var/cache/inference-server]
  register: service_dirs
"""

RETURN = r"""
host:
  description: The subcommand's JSON object (the docstring of the package module behind each command lists its keys).
  returned: success
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.adopt import adopt
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.facts import facts
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.install import install
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.restart import parse, restart
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_host_lib.service_dirs import service_dirs

# The subcommands that change the host (skipped in check mode).
CHANGING = ("record", "restore", "switch", "restart")


def run_module() -> None:
    """The module: run ``command`` with ``args`` and return its JSON object as ``host``."""
    module = AnsibleModule(
        argument_spec={
            "command": {
                "type": "str",
                "required": True,
                "choices": ["facts", "inspect", *CHANGING, "alive", "install", "service-dirs"],
            },
            "args": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    command, args = module.params["command"], module.params["args"]
    if module.check_mode and command in CHANGING:
        module.exit_json(changed=True, host={})
    try:
        if command == "facts":
            host = facts(args)
        elif command == "install":
            host = install(args[0], args[1:], check=module.check_mode) if len(args) > 1 else None
        elif command == "service-dirs":
            host = service_dirs(args, check=module.check_mode)
        elif command == "restart":
            kwargs = parse(args)
            host = restart(**kwargs) if kwargs is not None else None  # type: ignore[arg-type]
        else:
            host = adopt([command, *args])
    except SystemExit as exc:  # a refusal ({"failed": true, "msg": ...}) or argparse's usage error
        refusal = f"exit {exc.code}"
        if isinstance(exc.code, str):
            refusal = json.loads(exc.code).get("msg", exc.code) if exc.code.startswith("{") else exc.code
        module.fail_json(msg=f"llm_host {command} {' '.join(args)}: {refusal}")
    if host is None:
        module.fail_json(msg=f"llm_host {command}: wrong arguments {args} (llm_host_lib's docstrings list them)")
    if host.get("failed"):
        module.fail_json(msg=str(host["msg"]), host=host)
    module.exit_json(changed=bool(host.get("changed", command in CHANGING)), host=host)


if __name__ == "__main__":
    run_module()
