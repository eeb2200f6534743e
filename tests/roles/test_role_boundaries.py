"""The roles stand alone (issue 45, item 1): what crosses a role's boundary is declared.

Read from the repository's own YAML and templates, as Ansible would load them:

* every ``tasks_from`` of an ``include_role`` or ``import_role`` (deploy.yml, playbooks/, roles/,
  molecule/) names an entry point the called role declares in its ``meta/argument_specs.yml``;
* no role, playbook or inventory file reads a role's private variable (``_<role>_...``, ``__<role>_...``)
  but the role itself;
* no two roles call each other's task files, directly or round a longer loop;
* each state file has one writer: the last-known-good record only through the ``last_known_good``
  module (one task), the converged record only through ``converged_state``, the adoption's
  report through one task.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta").is_dir())
ROLE_CALLS = {"include_role", "import_role", "ansible.builtin.include_role", "ansible.builtin.import_role"}
# Modules that write a file, and the arguments that name it.
WRITERS = {
    "copy": ("dest",),
    "template": ("dest",),
    "file": ("path", "dest"),
    "lineinfile": ("path", "dest"),
    "blockinfile": ("path", "dest"),
    "replace": ("path", "dest"),
}
# A state file (a text its path holds) and the one module allowed to write it (None: any one task).
STATE_FILES = {
    "last-known-good": "last_known_good",
    "_lkg_dir": "last_known_good",
    "converged.json": "converged_state",
    "converged_record": "converged_state",
    "report.json": None,
}


class Loader(yaml.SafeLoader):
    """SafeLoader that reads Ansible's tags (!vault, !unsafe) as plain strings."""


Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node))


def yaml_files() -> list[Path]:
    """The YAML a play loads: deploy.yml, playbooks/, the roles' tasks, the molecule scenarios."""
    found = [REPO / "deploy.yml", *sorted((REPO / "playbooks").rglob("*.yml"))]
    found += sorted((REPO / "roles").glob("*/tasks/*.yml"))
    found += sorted(p for p in (REPO / "molecule").rglob("*.yml") if p.name != "molecule.yml")
    return found


def mappings(node: Any) -> Iterator[dict]:
    """Every mapping in a loaded YAML document, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from mappings(value)


def tasks(path: Path) -> Iterator[dict]:
    """Every mapping of ``path`` (a task, a block or anything inside them)."""
    yield from mappings(yaml.load(path.read_text(), Loader=Loader))


def owner(path: Path) -> str | None:
    """The role a file belongs to, or None outside roles/."""
    parts = path.relative_to(REPO).parts
    return parts[1] if parts[0] == "roles" else None


def role_calls() -> list[tuple[Path, str, str]]:
    """(file, role, entry point) of every include_role/import_role; ``main`` without tasks_from."""
    calls = []
    for path in yaml_files():
        for task in tasks(path):
            for key in ROLE_CALLS & set(task):
                spec = task[key] or {}
                entry = re.sub(r"\.ya?ml$", "", str(spec.get("tasks_from", "main")))
                calls.append((path, str(spec.get("name")), entry))
    return calls


def entry_points(role: str) -> set[str]:
    """The entry points ``roles/<role>/meta/argument_specs.yml`` declares."""
    specs = REPO / "roles" / role / "meta" / "argument_specs.yml"
    if not specs.exists():
        return set()
    return set((yaml.load(specs.read_text(), Loader=Loader) or {}).get("argument_specs", {}))


def test_every_task_file_called_from_outside_is_a_declared_entry_point() -> None:
    undeclared = sorted(
        f"{path.relative_to(REPO)} calls {role}'s {entry}"
        for path, role, entry in role_calls()
        if role in ROLES and entry not in entry_points(role)
    )
    assert undeclared == []


def product_files() -> list[Path]:
    """The YAML and templates of the product: the roles', deploy.yml, playbooks/ and the inventory's variables.
    Not molecule/: its test playbooks may look at a role's internals (the mirror scenario asserts on what
    model_sync's module planned, which the role does not export)."""
    found = [REPO / "deploy.yml"]
    for top in ("roles", "playbooks", "group_vars", "host_vars", "inventory"):
        found += sorted(p for p in (REPO / top).rglob("*") if p.suffix in (".yml", ".j2") and p.is_file())
    return found


def test_no_role_reads_another_roles_private_variable() -> None:
    """Nor does a playbook or the inventory: what crosses a role's boundary is a public, documented name."""
    private = re.compile(r"(?<![A-Za-z0-9_])__?(" + "|".join(sorted(ROLES, key=len, reverse=True)) + r")_[a-z0-9_]+")
    found = []
    for path in product_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in private.finditer(line):
                if match.group(1) != owner(path):
                    found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)}")
    assert found == []


def test_no_two_roles_call_each_other() -> None:
    edges: dict[str, set[str]] = {}
    for path, role, _entry in role_calls():
        caller = owner(path)
        if caller and role != caller:
            edges.setdefault(caller, set()).add(role)

    def loop_from(start: str, at: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for callee in sorted(edges.get(at, ())):
            if callee == start:
                return (*seen, callee)
            if callee not in seen:
                found = loop_from(start, callee, (*seen, callee))
                if found:
                    return found
        return None

    loops = sorted({" -> ".join(found) for role in edges if (found := loop_from(role, role, (role,)))})
    assert loops == []


def test_each_state_file_has_one_writer() -> None:
    writers: dict[str, list[tuple[str, str]]] = {name: [] for name in STATE_FILES}
    for path in yaml_files():
        for task in tasks(path):
            for key, value in task.items():
                module = key.removeprefix("ansible.builtin.")
                if not isinstance(value, dict) or (module not in WRITERS and module not in STATE_FILES.values()):
                    continue
                named = " ".join(str(value.get(arg, "")) for arg in WRITERS.get(module, ("path", "dir")))
                for state_file in STATE_FILES:
                    if state_file in named:
                        writers[state_file].append((f"{path.relative_to(REPO)}: {task.get('name')}", module))
    wrong = {
        state_file: found
        for state_file, found in writers.items()
        if (len(found) > 1 if STATE_FILES[state_file] is None else any(m != STATE_FILES[state_file] for _, m in found))
    }
    assert wrong == {}
