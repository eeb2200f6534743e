"""The host's deploy lock (roles/deploy_lock): the module's acquire/release logic and the
controller-side identity and liveness lookup, without a host. The molecule scenario
``reliability`` runs it for real (a killed run taken over, a concurrent run refused)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

ROLE = Path(__file__).resolve().parents[2] / "roles" / "deploy_lock"


def load(name: str, path: Path) -> ModuleType:
    """Import a plugin file as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = load("deploy_lock_module", ROLE / "library" / "deploy_lock.py")
run = load("deploy_lock_run", ROLE / "lookup_plugins" / "deploy_lock_run.py")


def owner(run_id: str, **extra) -> dict:
    """A lock owner record."""
    return {"run_id": run_id, "controller": "ctl", "pid": 1, "pid_start": 1, "user": "ops", **extra}


def test_a_free_lock_is_taken_and_a_held_one_refused(tmp_path):
    path = str(tmp_path / "lock")
    first = lock.acquire(path, owner("a"), 3600, None, None, check=False, now=1000.0)
    assert first["acquired"] and json.loads(Path(path).read_text())["run_id"] == "a"
    assert os.stat(path).st_mode & 0o777 == 0o600, "the lock names the controller, the user and the run: root's only"
    second = lock.acquire(path, owner("b"), 3600, None, None, check=False, now=1010.0)
    assert second == {"acquired": False, "holder": dict(json.loads(Path(path).read_text()), age_s=10.0)}
    again = lock.acquire(path, owner("a"), 3600, None, None, check=False, now=1020.0)
    assert again["acquired"] and again["lock"]["acquired_at"] == 1000.0, "re-taking keeps the original time"


def test_a_stale_lock_is_taken_over_and_says_why(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, owner("a"), 3600, None, None, check=False, now=1000.0)
    fresh = lock.acquire(path, owner("b"), 3600, None, None, check=False, now=4600.0)
    assert not fresh["acquired"], "exactly stale_after_s old is not stale yet"
    late = lock.acquire(path, owner("b"), 3600, None, None, check=False, now=4601.0)
    assert late["acquired"] and late["took_over"]["run_id"] == "a"
    assert late["took_over"]["reason"] == "it is 3601 s old, more than deploy_lock_stale_after_s 3600"
    assert json.loads(Path(path).read_text())["run_id"] == "b"


def test_a_dead_run_is_taken_over_only_if_it_still_holds_the_lock(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire(path, owner("a"), 0, None, None, check=False, now=1000.0)
    wrong = lock.acquire(path, owner("c"), 0, "b", "gone", check=False, now=9e9)
    assert not wrong["acquired"], "a takeover names the run it found dead; another holder is not taken over"
    taken = lock.acquire(path, owner("c"), 0, "a", "its ansible-playbook process (pid 1) is gone", check=False)
    assert taken["acquired"] and taken["took_over"]["reason"].startswith("its ansible-playbook process")


def test_release_removes_only_our_own_lock(tmp_path):
    path = str(tmp_path / "lock")
    assert lock.release(path, "a", check=False) == (False, None)
    lock.acquire(path, owner("a"), 0, None, None, check=False)
    released, other = lock.release(path, "b", check=False)
    assert not released and other["run_id"] == "a" and Path(path).exists()
    assert lock.release(path, "a", check=False) == (True, None) and not Path(path).exists()


def test_check_mode_reads_but_never_writes(tmp_path):
    path = str(tmp_path / "lock")
    assert lock.acquire(path, owner("a"), 0, None, None, check=True)["acquired"]
    assert not Path(path).exists()
    lock.acquire(path, owner("a"), 0, None, None, check=False)
    assert not lock.acquire(path, owner("b"), 0, None, None, check=True)["acquired"]
    assert lock.release(path, "a", check=True) == (True, None) and Path(path).exists()


def test_an_unreadable_lock_file_is_a_lock_of_an_unknown_holder(tmp_path):
    path = tmp_path / "lock"
    path.write_text("garbage")
    os.utime(path, (1000, 1000))
    held = lock.acquire(str(path), owner("b"), 100, None, None, check=False, now=1050.0)
    assert not held["acquired"] and held["holder"]["run_id"] == "unknown" and held["holder"]["age_s"] == 50.0
    assert lock.acquire(str(path), owner("b"), 100, None, None, check=False, now=1101.0)["acquired"]


def test_two_runs_starting_together_get_the_lock_once(tmp_path):
    path = str(tmp_path / "lock")
    barrier = threading.Barrier(8)
    results = []

    def take(i: int) -> None:
        barrier.wait()
        results.append(lock.acquire(path, owner(f"r{i}"), 0, None, None, check=False)["acquired"])

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_the_identity_is_the_outermost_process_with_the_same_command_line():
    """A forked worker (like Ansible's) reports its parent, the process that was started."""
    code = (
        "import os, json; import deploy_lock_run as r; "
        "pid = os.fork()\n"
        "if pid == 0:\n    print(json.dumps(r.identity())); sys.stdout.flush(); os._exit(0)\n"
        "os.waitpid(pid, 0); print(os.getpid())"
    )
    env = dict(os.environ, PYTHONPATH=str(ROLE / "lookup_plugins"))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROLE / "lookup_plugins"
    )
    if proc.returncode != 0 and "ansible" in proc.stderr:
        pytest.fail(proc.stderr)
    child, parent = proc.stdout.strip().splitlines()
    identity = json.loads(child)
    assert identity["pid"] == int(parent)
    assert identity["run_id"].endswith(f":{identity['pid']}:{identity['pid_start']}")
    assert run.alive(identity) is False, "that process has exited"


def test_liveness_of_a_holder():
    me = run.identity()
    assert run.alive(me) is True
    assert run.alive(dict(me, pid_start=me["pid_start"] + 1)) is False, "a reused pid is another process"
    assert run.alive(dict(me, controller_boot_id="another-boot")) is False, "the controller rebooted since"
    assert run.alive(dict(me, controller="another-controller", pid=1)) is True, "cannot be told from here"


def test_stat_fields_survive_a_command_name_with_spaces_and_parentheses(tmp_path):
    odd = tmp_path / "py (x) y"
    odd.symlink_to(sys.executable)
    proc = subprocess.Popen([str(odd), "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.3)
        assert Path(f"/proc/{proc.pid}/stat").read_text().split(" ", 1)[1].startswith("(py (x) y)")
        assert run.parent(proc.pid) == os.getpid()
        assert run.start_time(proc.pid) > 0
    finally:
        proc.kill()
        proc.wait()


def test_the_locks_directory_is_made_roots_alone(tmp_path):
    path = tmp_path / "run" / "llm-deploy" / "deploy.lock"
    assert lock.acquire(str(path), owner("a"), 0, None, None, check=False)["acquired"]
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.parent.stat().st_uid == os.geteuid()


@pytest.mark.parametrize("where", ["world-writable", "another user's", "a link"])
def test_a_directory_another_user_can_write_is_refused_before_anything_is_written(tmp_path, where):
    """As /run/lock (1777) was the default's: a local user there could forge the lock (every deploy
    refused), date one in the future (the watchdog skips for ever) or plant a link at the guard."""
    directory = tmp_path / "locks"
    if where == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        directory.symlink_to(tmp_path / "elsewhere")
    else:
        directory.mkdir()
        os.chmod(directory, 0o1777 if where == "world-writable" else 0o700)
        if where == "another user's":
            os.chown(directory, 65534, 65534)
    with pytest.raises(lock.LockPlaceError, match="set deploy_lock_path to a file in a directory only root can write"):
        lock.acquire(str(directory / "deploy.lock"), owner("a"), 0, None, None, check=False)
    assert not list((tmp_path / "elsewhere" if where == "a link" else directory).iterdir()), "something was written"


def test_a_link_planted_at_the_guard_is_not_followed(tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("root's\n")
    directory = tmp_path / "locks"
    directory.mkdir(mode=0o700)
    (directory / "deploy.lock.guard").symlink_to(canary)
    with pytest.raises(OSError):
        lock.acquire(str(directory / "deploy.lock"), owner("a"), 0, None, None, check=False)
    assert canary.read_text() == "root's\n" and not (directory / "deploy.lock").exists()
