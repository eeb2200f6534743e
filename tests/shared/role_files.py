"""Use a role's files from a test: import a Python file that is no installed module (a role's module,
helper or launcher, a filter) by its path, or run a role's task files with ansible-playbook on localhost.

Roles are no packages and their files are not installed on the controller, so a test imports
them from where they are, without putting their folder on ``sys.path``.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The repository's collection llm_deploy.inference, whose module_utils the launchers import by name.
COLLECTIONS = REPO / "collections"


def import_file(path: Path, name: str = "") -> ModuleType:
    """The module that the Python file at ``path`` defines, named ``name`` (default: after the file)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_role_tasks(
    tmp_path: Path,
    variables: dict[str, Any],
    tasks_from: list[str],
    check_mode: bool = True,
    role: str = "inference_server",
    json_output: bool = False,
    umask: int = -1,
) -> subprocess.CompletedProcess:
    """Run ``role``'s task files ``tasks_from`` in turn on this machine (connection local, modules run by
    this test's Python) with ``variables`` as extra vars; the repository's ansible.cfg, roles and filters.

    ``json_output`` selects the ``json`` stdout callback (read it with :func:`task_results`);
    ``umask`` is the one ansible-playbook, and so every module, runs under (-1: this process's)."""
    tasks = "\n".join(
        f"""    - name: Run {role} {name}
      ansible.builtin.include_role:
        name: {role}
        tasks_from: {name}"""
        for name in tasks_from
    )
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        textwrap.dedent("""\
        - name: Exercise the role's tasks
          hosts: localhost
          gather_facts: false
          tasks:
        """)
        + tasks
        + "\n"
    )
    (tmp_path / "facts.json").write_text(json.dumps(variables))
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook), "-e", f"@{tmp_path / 'facts.json'}"]
    env = ansible_env(**({"ANSIBLE_STDOUT_CALLBACK": "json"} if json_output else {}))
    return subprocess.run(
        cmd + (["--check"] if check_mode else []), capture_output=True, text=True, env=env, check=False, umask=umask
    )


def ansible_env(**more: str) -> dict[str, str]:
    """The environment of an ansible-playbook run on localhost: the repository's ansible.cfg, roles and
    filters, modules run by this test's Python, quiet about the inline inventory; and ``more``."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(REPO / "filter_plugins"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
        "DEPLOY_CACHE_DIR": os.environ.get("DEPLOY_CACHE_DIR") or str(REPO / ".cache"),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        **more,
    }


def task_results(run: subprocess.CompletedProcess) -> list[tuple[str, dict[str, Any]]]:
    """(task name, localhost's result) of every task of a ``json_output`` run, in order."""
    out = json.loads(run.stdout[run.stdout.index("{") :])
    return [(task["task"]["name"], task["hosts"].get("localhost", {})) for task in out["plays"][0]["tasks"]]


def run_module_file(path: Path, args_file: Path) -> subprocess.CompletedProcess[str]:
    """Run a role's module file as Ansible does (``python MODULE ARGS_FILE``), by this test's Python: the
    module's ``ansible_collections.llm_deploy...`` imports find the collection installed (pyproject.toml)."""
    return subprocess.run([sys.executable, str(path), str(args_file)], capture_output=True, text=True, check=False)


@functools.cache
def launcher_as_on_a_host(launcher: Path) -> Path:
    """A role's launcher (``files/llm-host``, ``files/model-sync``) laid out as a host has it, to run with
    ``-SE``: a copy in a folder of its own beside ``ansible_collections``, here a link to the repository's
    collection tree, from which it imports its package by the package's one name. Removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="launcher-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "ansible_collections").symlink_to(COLLECTIONS / "ansible_collections")
    copy = folder / launcher.name
    shutil.copy2(launcher, copy)
    return copy
