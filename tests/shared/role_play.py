"""Run a role's task file with ansible-playbook on localhost, as the role runs it on a host.

The tests that need a role's real tasks (not a copy of their logic) on real directories use
this: the repository's ansible.cfg, roles and filters, and this test's Python as the modules'
interpreter. Results come back through the ``json`` stdout callback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# ansible-playbook against localhost, its modules run by this test's Python.
LOCALHOST_PLAYBOOK = [
    str(BIN / "ansible-playbook"),
    *("-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"),
]


def run_tasks(
    workdir: Path,
    role: str,
    tasks_from: str,
    variables: dict[str, Any],
    *args: str,
    json_output: bool = False,
    umask: int = -1,
) -> subprocess.CompletedProcess[str]:
    """``include_role`` ``role`` with ``tasks_from`` and ``variables`` on localhost; the finished run.

    ``json_output`` selects the ``json`` stdout callback (read it with :func:`task_results`);
    ``umask`` is the one ansible-playbook, and so every module, runs under (-1: this process's).
    """
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the role's tasks",
                    "ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from},
                }
            ],
        }
    ]
    (workdir / "play.yml").write_text(json.dumps(play))
    (workdir / "vars.json").write_text(json.dumps(variables))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_FILTER_PLUGINS=str(REPO / "filter_plugins"),
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    if json_output:
        env["ANSIBLE_STDOUT_CALLBACK"] = "json"
    cmd = [*LOCALHOST_PLAYBOOK, "-e", f"@{workdir / 'vars.json'}", *args, str(workdir / "play.yml")]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, check=False, umask=umask)


def task_results(run: subprocess.CompletedProcess[str]) -> list[tuple[str, dict[str, Any]]]:
    """(task name, localhost's result) of every task of a ``json_output`` run, in order."""
    out = json.loads(run.stdout[run.stdout.index("{") :])
    return [(task["task"]["name"], task["hosts"].get("localhost", {})) for task in out["plays"][0]["tasks"]]
