"""The controller's payload cache of the test targets (tools/controller-cache/ansiballz_cache.py, issue 52):
a later ansible-playbook run takes the payload an earlier one built, and never one older than its sources.

Real ansible-playbook runs against localhost, with a module of a collection of the test's own that
returns a value from its module_utils, and two library folders that both hold a module of one name
(as tests/nightly/fixtures/library/health_gate.py and roles/health_gate/library/health_gate.py do).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from role_files import ansible_env, task_results

ROOT = Path(__file__).resolve().parents[2]
MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
{import_line}


def main():
    AnsibleModule(argument_spec={{}}).exit_json(changed=False, value={value})


if __name__ == "__main__":
    main()
"""
# The name Ansible gives the collection's module in its payload cache.
COLLECTION_FQN = "ansible_collections.probe.cache.plugins.modules.answer"
COLLECTION_MODULE = MODULE.format(
    import_line="from ansible_collections.probe.cache.plugins.module_utils.answer import VALUE", value="VALUE"
)


def library_module(value: str) -> str:
    """A module of an ansible.legacy library folder that returns ``value``."""
    return MODULE.format(import_line="", value=repr(value))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A collection probe.cache (module answer, module_utils answer) and two library folders."""
    plugins = tmp_path / "collections/ansible_collections/probe/cache/plugins"
    (plugins / "modules").mkdir(parents=True)
    (plugins / "module_utils").mkdir()
    (tmp_path / "collections/ansible_collections/probe/cache/galaxy.yml").write_text(
        "namespace: probe\nname: cache\nversion: 1.0.0\n"
    )
    (plugins / "modules/answer.py").write_text(COLLECTION_MODULE)
    (plugins / "module_utils/answer.py").write_text('VALUE = "one"\n')
    for name in ("a", "b"):
        (tmp_path / f"library-{name}").mkdir()
        (tmp_path / f"library-{name}/probe_answer.py").write_text(library_module(f"from library {name}"))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    return tmp_path


def run(tree: Path, module: str, cache: bool = True, **env: str) -> object:
    """Run ``module`` once on localhost; the value it returned."""
    (tree / "play.yml").write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        f"    - {module}:\n      register: answer\n"
    )
    # The test's own configuration and collection; the cache where this test says (make pytest sets one).
    environment = ansible_env(
        ANSIBLE_CONFIG=str(tree / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(tree / "collections"),
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "tools/controller-cache"),
        ANSIBLE_CALLBACKS_ENABLED="ansiballz_cache",
        ANSIBALLZ_CONTROLLER_CACHE=str(tree / "cache"),
        **env,
    )
    if not cache:
        del environment["ANSIBALLZ_CONTROLLER_CACHE"]
    done = subprocess.run(["ansible-playbook", "-i", "localhost,", str(tree / "play.yml")], capture_output=True,
                          text=True, env=environment, cwd=tree, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return task_results(done)[0][1]["value"]


def payloads(tree: Path, name: str) -> dict[Path, int]:
    """The payloads kept for the module ``name`` (not their lock files): path -> modification time (ns)."""
    kept = (tree / "cache").glob(f"*/*/ansiballz_cache/*{name}-*")
    return {path: path.stat().st_mtime_ns for path in kept if path.suffix != ".lock"}


def test_a_later_run_takes_the_payload_and_an_edited_module_utils_file_builds_a_new_one(tree: Path) -> None:
    assert run(tree, "probe.cache.answer") == "one"
    first = payloads(tree, COLLECTION_FQN)
    assert len(first) == 1, first
    assert run(tree, "probe.cache.answer") == "one"
    assert payloads(tree, COLLECTION_FQN) == first, "the second run built the payload again"
    (tree / "collections/ansible_collections/probe/cache/plugins/module_utils/answer.py").write_text('VALUE = "two"\n')
    assert run(tree, "probe.cache.answer") == "two", "a payload older than its module_utils ran"
    assert len(payloads(tree, COLLECTION_FQN)) == 2


def test_an_edited_module_builds_a_new_payload(tree: Path) -> None:
    module = tree / "collections/ansible_collections/probe/cache/plugins/modules/answer.py"
    assert run(tree, "probe.cache.answer") == "one"
    module.write_text(COLLECTION_MODULE.replace("value=VALUE", "value=VALUE + ' edited'"))
    assert run(tree, "probe.cache.answer") == "one edited", "a payload older than its module ran"


def test_two_modules_of_one_name_in_two_folders_keep_a_payload_each(tree: Path) -> None:
    """Ansible keys its own per-run payloads by the module's name alone (ansible.legacy.probe_answer)."""
    assert run(tree, "probe_answer", ANSIBLE_LIBRARY=str(tree / "library-a")) == "from library a"
    assert run(tree, "probe_answer", ANSIBLE_LIBRARY=str(tree / "library-b")) == "from library b"
    assert len(payloads(tree, "ansible.legacy.probe_answer")) == 2


def test_without_the_directory_the_callback_keeps_nothing(tree: Path) -> None:
    assert run(tree, "probe.cache.answer", cache=False) == "one"
    assert not (tree / "cache").exists()


def test_the_test_targets_of_the_makefile_turn_it_on() -> None:
    database = subprocess.run(["make", "-pn", "-C", str(ROOT), "pytest"], capture_output=True, text=True,
                              check=False).stdout  # fmt: skip
    for target in ("test", "pytest", "molecule", "quick"):
        for line in (
            f"{target}: ANSIBALLZ_CONTROLLER_CACHE := {ROOT}/.cache/ansiballz",
            f"{target}: ANSIBLE_CALLBACK_PLUGINS := {ROOT}/tools/controller-cache",
            f"{target}: ANSIBLE_CALLBACKS_ENABLED := ansiballz_cache",
        ):
            assert line in database.splitlines(), line
