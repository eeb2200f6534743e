"""The fast inner loop between full runs: lint what changed, and run the tests of what changed.

    tools/quick-tests                 # what changed since HEAD (uncommitted, staged and new files)
    tools/quick-tests --base main~3   # what changed since a commit
    tools/quick-tests --list          # only say which checks and tests it would run, and why

``make quick`` runs it. The changed files are git's (``git diff --name-only BASE`` and the untracked
files that git does not ignore). Each is linted by what lints it in ``make lint``: ruff (check and
format) for Python, yamllint for YAML, ansible-lint when a role, playbook or inventory file changed.
The tests are the test files that name what changed (:func:`tests_for`): a changed test file
itself; a file of tests/shared by its import; a role by its name; a package of the collection by
its name; a tool by its name or its module; a doc by test_docs. A changed molecule scenario is
named, not run: ``make molecule SCENARIOS=NAME`` runs it. What none of that covers is the full
``make test``'s job.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = "tests"
# A module name that says nothing by itself: a test naming "cli" is not about tools/deploytools/cli.py.
GENERIC_STEMS = {"__init__", "main", "common", "cli", "base", "config", "errors", "install", "state", "facts"}
COLLECTION_UTILS = "collections/ansible_collections/llm_deploy/inference/plugins/module_utils/"
ANSIBLE_PARTS = ("roles/", "playbooks/", "inventory/", "group_vars/", "host_vars/", "deploy.yml")


def changed_files(base: str, repo: Path = REPO) -> list[str]:
    """The files that differ from ``base`` (tracked) and the new files git does not ignore, that exist."""

    def git(*args: str) -> list[str]:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if line]

    names = set(git("diff", "--name-only", base)) | set(git("ls-files", "--others", "--exclude-standard"))
    return sorted(name for name in names if (repo / name).is_file())


def keys_of(path: str) -> list[str]:
    """The words a test that covers ``path`` names: a role, a package, a module or a tool."""
    parts = Path(path).parts
    stem = Path(path).stem
    keys: list[str] = []
    if parts[0] == "roles" and len(parts) > 1:
        keys.append(parts[1])
    elif path.startswith(COLLECTION_UTILS) and len(parts) > 7:
        keys.append(parts[6])  # the package: llm_gate, llm_host_lib, ... (its modules' names are too common)
    elif parts[0] == "tools" and len(parts) == 2:
        keys += [f"tools/{stem}", stem.replace("-", "_")]
    elif parts[0] == "tools" and stem not in GENERIC_STEMS:
        keys.append(stem)  # a module of deploytools, by its import name
    elif parts[0] in ("bench", "playbooks"):
        keys.append(f"{parts[0]}/{stem}")
    elif parts[0] == "filter_plugins":
        keys.append(stem)
    return sorted(set(keys))


def tests_for(changed: Iterable[str], test_texts: dict[str, str]) -> dict[str, list[str]]:
    """Each test file to run and why (the changed files that brought it in)."""
    chosen: dict[str, list[str]] = {}

    def add(test: str, why: str) -> None:
        chosen.setdefault(test, [])
        if why not in chosen[test]:
            chosen[test].append(why)

    for path in changed:
        name = Path(path).name
        if path.startswith(f"{TESTS}/") and name.startswith("test_") and name.endswith(".py"):
            add(path, path)
            continue
        if path.startswith(f"{TESTS}/") and path.endswith(".py"):
            pattern = re.compile(rf"^\s*(from|import)\s+{re.escape(Path(path).stem)}\b", re.M)
        elif path.startswith("docs/") or path == "README.md":
            pattern = re.compile(r"\bDOCS\b|" + re.escape(Path(path).name))  # test_docs reads them all
        else:
            keys = keys_of(path)
            if not keys:
                continue
            pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(k) for k in keys) + r")(?![\w-])")
        for test, text in test_texts.items():
            if pattern.search(text):
                add(test, path)
    return dict(sorted(chosen.items()))


def test_texts(repo: Path = REPO) -> dict[str, str]:
    """Every pytest file of tests/, by its path, with its text."""
    return {str(p.relative_to(repo)): p.read_text(encoding="utf-8") for p in sorted((repo / TESTS).rglob("test_*.py"))}


def lint_commands(changed: Sequence[str], venv_bin: Path) -> list[list[str]]:
    """What ``make lint`` would run on these files, for those it lints."""
    python = [p for p in changed if p.endswith(".py")]  # what `ruff check .` finds: scripts without .py are not
    yaml = [p for p in changed if p.endswith((".yml", ".yaml"))]
    commands = []
    if python:
        commands += [[str(venv_bin / "ruff"), "check", *python], [str(venv_bin / "ruff"), "format", "--check", *python]]
    if yaml:
        commands.append([str(venv_bin / "yamllint"), "-s", *yaml])
    if any(p.startswith(ANSIBLE_PARTS) for p in changed):
        commands.append([str(venv_bin / "ansible-lint")])
    if any(p.startswith("roles/") and ("/meta/argument_specs.yml" in p or "/defaults/" in p) for p in changed):
        commands.append([str(venv_bin / "python"), "tools/check-argument-specs"])
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    """Say what changed and what covers it; with no --list, lint it and run those tests."""
    parser = argparse.ArgumentParser(prog="quick-tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit to compare with (default HEAD)")
    parser.add_argument("--list", action="store_true", help="only list the checks and the tests, with why")
    parser.add_argument("--workers", type=int, default=3, help="pytest workers (default 3, as make pytest)")
    args = parser.parse_args(argv)
    changed = changed_files(args.base)
    if not changed:
        print(f"quick-tests: nothing changed since {args.base}")
        return 0
    venv_bin = Path(sys.executable).parent
    tests = tests_for(changed, test_texts())
    scenarios = sorted({Path(p).parts[1] for p in changed if p.startswith("molecule/") and len(Path(p).parts) > 2})
    print(f"quick-tests: {len(changed)} file(s) changed since {args.base}; {len(tests)} test file(s) cover them")
    for test, why in tests.items():
        print(f"  {test}  <- {', '.join(why[:3])}{' ...' if len(why) > 3 else ''}")
    for scenario in scenarios:
        print(f"  molecule/{scenario} changed: make molecule SCENARIOS={scenario} runs it (not here)")
    commands = lint_commands(changed, venv_bin)
    if tests:
        commands.append(
            [str(venv_bin / "pytest"), "-q", "-n", str(args.workers), "--dist", "loadfile", "--no-loadscope-reorder",
             *tests]
        )  # fmt: skip
    if args.list:
        for command in commands:
            print("  would run: " + " ".join(command[:6]) + (" ..." if len(command) > 6 else ""))
        return 0
    status = 0
    for command in commands:
        print("quick-tests: " + " ".join(command[:6]) + (" ..." if len(command) > 6 else ""), flush=True)
        status = status or subprocess.run(command, cwd=REPO, check=False).returncode
    print(f"quick-tests: {'ok' if status == 0 else 'FAILED'}")
    return status
