"""tools/quick-tests (make quick): which tests cover what changed, from the repository's own test files."""

from __future__ import annotations

import subprocess

from deploytools import quick_tests

UTILS = quick_tests.COLLECTION_UTILS


def test_each_kind_of_change_brings_in_the_tests_that_name_it():
    texts = {
        "tests/health_gate/test_a.py": "from ansible_collections.llm_deploy.inference.plugins.module_utils "
        "import llm_gate",
        "tests/roles/test_b.py": 'ROLE = REPO / "roles" / "model_sync"\nfrom fake_http import BackgroundServer',
        "tests/tools/test_c.py": 'subprocess.run(["tools/probe-set", "show"])\nfrom deploytools import lock_file',
        "tests/tools/test_docs.py": 'DOCS = sorted((ROOT / "docs").glob("*.md"))',
        "tests/tools/test_d.py": "nothing that names a changed file: model_syncer, llm_gate_x",
    }
    chosen = quick_tests.tests_for(
        [
            f"{UTILS}llm_gate/correctness.py",
            "roles/model_sync/tasks/main.yml",
            "tools/probe-set",
            "tools/deploytools/lock_file.py",
            "tests/shared/fake_http.py",
            "docs/health-gate.md",
            "tests/tools/test_new.py",
            "molecule/adopt/converge.yml",
        ],
        texts,
    )
    assert chosen == {
        "tests/health_gate/test_a.py": [f"{UTILS}llm_gate/correctness.py"],
        "tests/roles/test_b.py": ["roles/model_sync/tasks/main.yml", "tests/shared/fake_http.py"],
        "tests/tools/test_c.py": ["tools/probe-set", "tools/deploytools/lock_file.py"],
        "tests/tools/test_docs.py": ["docs/health-gate.md"],
        "tests/tools/test_new.py": ["tests/tools/test_new.py"],
    }


def test_generic_module_names_are_not_keys():
    assert quick_tests.keys_of("tools/deploytools/cli.py") == []
    assert quick_tests.keys_of(f"{UTILS}llm_host_lib/install.py") == ["llm_host_lib"]
    assert quick_tests.keys_of("bench/correctness") == ["bench/correctness"]


def test_a_change_in_the_work_tree_is_found_and_covered(tmp_path):
    """In a git repository: a file changed in the work tree is listed, with the test that names it."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "tests").mkdir()
    (repo / "tools").mkdir()
    (repo / "tests" / "test_x.py").write_text("import deploytools.thing  # tools/thing\n")
    (repo / "tools" / "thing").write_text("#!/usr/bin/env python3\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True
    )
    assert quick_tests.changed_files("HEAD", repo) == []
    (repo / "tools" / "thing").write_text("#!/usr/bin/env python3\nprint(1)\n")
    changed = quick_tests.changed_files("HEAD", repo)
    assert changed == ["tools/thing"]
    assert quick_tests.tests_for(changed, quick_tests.test_texts(repo)) == {"tests/test_x.py": ["tools/thing"]}
