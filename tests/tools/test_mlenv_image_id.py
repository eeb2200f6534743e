"""The baked rehearsal image ($MLENV_IMAGE, `make image-mlenv`) is never older than what bakes it (issue 52):
its tag is tools/mlenv-image-id, the hash of the ml_env role, its locks, the bake playbook and the
group_vars it reads, so an edit to any of them names an image that does not exist yet, and make bakes it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What tools/mlenv-image-id reads, and what it must not (a change elsewhere keeps the image).
INPUTS = [
    "tools/mlenv-image-id",
    "tools/build-base-image",
    "tools/base-image",
    "roles/ml_env",
    "playbooks/bake-sim-image.yml",
    "group_vars/all.yml",
    "group_vars/rehearsal.yml",
]


def image_id(repo: Path) -> str:
    """tools/mlenv-image-id in ``repo``."""
    run = subprocess.run([str(repo / "tools/mlenv-image-id")], capture_output=True, text=True, check=True)
    return run.stdout.strip()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The bake's inputs (and the script) copied into a tree of their own, bytecode left out."""
    for name in INPUTS:
        source, target = ROOT / name, tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def make(*args: str) -> str:
    """The output of make in the repository (``args``: options, targets and variables)."""
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def test_the_makefile_tags_the_baked_image_with_the_bake_id() -> None:
    show = make("--eval", "show-mlenv-image: ; @echo $(MLENV_IMAGE)", "show-mlenv-image")
    assert show.strip() == f"local/bookworm-systemd-mlenv:{image_id(ROOT)}"


@pytest.mark.parametrize(
    "edited",
    [
        "roles/ml_env/tasks/main.yml",
        "roles/ml_env/files/locks/transformers-cpu.txt",
        "roles/ml_env/files/venv_state.py",
        "playbooks/bake-sim-image.yml",
        "group_vars/rehearsal.yml",
        "tools/base-image/ansiballz_code_cache.py",
    ],
)
def test_an_edit_to_what_bakes_the_image_names_a_new_image_that_make_bakes(copy: Path, edited: str) -> None:
    """A role file edited: a new tag, and make's recipe asks docker for that tag and bakes it when absent."""
    before = image_id(copy)
    assert before == image_id(ROOT), "the copy must hash as the repository does"
    with (copy / edited).open("a") as handle:
        handle.write("# edited\n")
    after = image_id(copy)
    assert after != before
    recipe = make("-n", f"MLENV_IMAGE=local/bookworm-systemd-mlenv:{after}", "image-mlenv")
    assert f"docker image inspect local/bookworm-systemd-mlenv:{after} " in recipe, recipe
    assert f"playbooks/bake-sim-image.yml -e bake_image=local/bookworm-systemd-mlenv:{after} " in recipe, recipe


def test_bytecode_and_files_outside_the_bake_keep_the_image(copy: Path) -> None:
    before = image_id(copy)
    (copy / "roles/ml_env/files/__pycache__").mkdir()
    (copy / "roles/ml_env/files/__pycache__/venv_state.cpython-311.pyc").write_bytes(b"\0")
    (copy / "roles/inference_server/tasks").mkdir(parents=True)
    (copy / "roles/inference_server/tasks/main.yml").write_text("---\n")
    (copy / "README.md").write_text("# edited\n")
    assert image_id(copy) == before
