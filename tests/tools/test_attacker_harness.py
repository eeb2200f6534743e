"""The attacker of molecule/attacker (files/attacker.py, files/run_steps.py) on a tree of this machine:
which paths an account below root can replace is read from the modes (the sticky bit included), a link
is planted as that account and taken out again, the manifest sees a root-owned file change outside the
declared paths, and a step that stops at a link is run again only when the link was its own account's.

The tree is made by root (these tests run as root, as CI and the scenario's host do) for the account
nobody."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from role_files import import_file

REPO = Path(__file__).resolve().parents[2]
attacker = import_file(REPO / "molecule/attacker/files/attacker.py")
run_steps = import_file(REPO / "molecule/attacker/files/run_steps.py")
NOBODY = pwd.getpwnam("nobody")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants as another account: needs root")


@pytest.fixture
def tree() -> Iterator[Path]:
    """A tree under /tmp that nobody can reach: theirs/ (nobody's own), shared/ (1777, a root file in it),
    roots/ (root's, 0755), and a root-owned canary."""
    top = Path(tempfile.mkdtemp(prefix="attacker-test-", dir="/tmp"))
    top.chmod(0o755)
    (top / "theirs").mkdir()
    (top / "theirs/log").write_text("the server's log\n")
    for path in (top / "theirs", top / "theirs/log"):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    (top / "shared").mkdir()
    (top / "shared").chmod(0o1777)
    (top / "shared/root-file").write_text("root's\n")
    (top / "roots").mkdir()
    (top / "roots/config").write_text("root's\n")
    (top / "canary").write_text("canary\n")
    yield top
    shutil.rmtree(top)


def writable(who: list, tree: Path) -> tuple[dict, list]:
    """What ``who`` can write in ``tree`` and the directories they can make names in (the survey's first two)."""
    snapshot, into, _ = attacker.survey(who, (), [], {}, str(tree))
    return snapshot, into


def listed(declared: list[str], cache: dict, tree: Path) -> dict:
    """The manifest of ``tree`` (the survey's third)."""
    return attacker.survey([], (), declared, cache, str(tree))[2]


def test_the_writable_paths_come_from_the_modes_and_the_sticky_bit(tree):
    nobody = attacker.Account("nobody")
    (tree / "shared/root-file").unlink()
    found, into = writable([nobody], tree)
    assert sorted(into) == [str(tree / "shared"), str(tree / "theirs")], "an empty shared directory is watched too"
    assert str(tree / "theirs/log") in found
    assert str(tree / "theirs") not in found, "their directory is theirs, but its name is in root's"
    assert str(tree / "roots/config") not in found
    (tree / "shared/root-file").write_text("root's\n")
    assert str(tree / "shared/root-file") not in writable([nobody], tree)[0], (
        "another's name in a sticky directory is theirs"
    )
    (tree / "shared").chmod(0o777)
    assert str(tree / "shared/root-file") in writable([nobody], tree)[0]


def test_a_link_is_planted_as_the_account_and_taken_out_again(tree):
    nobody = attacker.Account("nobody")
    paths = [str(tree / "theirs/log"), str(tree / "theirs/new/name"), str(tree / "roots/config")]
    planted = attacker.plant(paths, [nobody], str(tree / "canary"))
    assert [(item["path"], item["by"], item["own"]) for item in planted] == [
        (paths[0], "nobody", True),
        (paths[1], "nobody", True),
    ], "root's directory is not nobody's to plant in"
    assert os.readlink(paths[0]) == str(tree / "canary") and os.lstat(paths[0]).st_uid == NOBODY.pw_uid
    attacker.unplant(planted, str(tree / "canary"))
    assert (tree / "theirs/log").read_text() == "the server's log\n"
    assert not (tree / "theirs/new").exists()


def test_a_root_file_changed_outside_the_declared_paths_is_a_difference(tree):
    cache: dict = {}
    declared = [str(tree / "roots") + "*"]
    before = listed(declared, cache, tree)
    (tree / "roots/config").write_text("changed\n")
    assert attacker.differences(before, listed(declared, cache, tree)) == []
    (tree / "canary").write_text("appended\n")
    changed = attacker.differences(before, listed(declared, cache, tree))
    assert [d["path"] for d in changed] == [str(tree / "canary")]
    assert changed[0]["before"][4] != changed[0]["after"][4], "the sha256 moved"


def test_a_scratch_tree_is_walked_but_marked(tree):
    marks = {path: scratch for path, _, scratch in attacker.walk((), str(tree), (str(tree / "theirs"),))}
    assert marks[str(tree / "theirs")] and marks[str(tree / "theirs/log")], "the scratch tree and below it"
    assert not marks[str(tree / "roots/config")]


def test_a_step_runs_again_only_past_a_link_in_its_own_accounts_directory():
    own = {"path": "/var/cache/svc/hub", "by": "svc", "own": True}
    shared = {"path": "/tmp/deploy.lock", "by": "mallory", "own": False}
    clean = {"canary_changed": False, "differences": []}
    refused = "Task failed: [Errno 20] Not a directory: '/var/cache/svc/hub/models--x'"
    assert run_steps.refused_at(dict(clean, planted=[own]), 2, refused) == ["/var/cache/svc/hub"]
    assert run_steps.refused_at(dict(clean, planted=[own]), 0, refused) == []
    assert run_steps.refused_at(dict(clean, planted=[own, shared]), 2, refused + " /tmp/deploy.lock") == []
    assert run_steps.refused_at(dict(clean, planted=[own], canary_changed=True), 2, refused) == []
    assert run_steps.refused_at(dict(clean, planted=[own]), 2, "/var/cache/svc/hubris") == []
    named_before = "TASK [its log is /var/cache/svc/hub] ok PLAY RECAP failed=1 [ERROR]: the gate failed"
    assert run_steps.refused_at(dict(clean, planted=[own]), 2, named_before) == [], "only the failure counts"
