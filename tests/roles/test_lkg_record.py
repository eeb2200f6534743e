"""The last-known-good record is replaced whole (library/last_known_good.py); a rollback refuses a
record whose files are gone.

The module's functions run on real directories here, and the module itself through
ansible-playbook on localhost; the refusal runs the role's tasks/rollback.yml with
ansible-playbook on localhost against a record in a temporary directory (no systemd needed:
the refusal comes before anything would be restarted). The molecule scenarios ``default`` and
``rollback`` run record_good.yml and rollback.yml on a systemd host.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import durability
import pytest
from role_files import REPO, import_file, run_role_tasks

ROLE = REPO / "roles" / "inference_server"
BIN = Path(sys.executable).parent
# ansible-playbook against localhost, its modules run by this test's Python.
LOCALHOST_PLAYBOOK = [
    str(BIN / "ansible-playbook"),
    *("-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"),
]


def load() -> ModuleType:
    """library/last_known_good.py as a Python module."""
    return import_file(ROLE / "library" / "last_known_good.py")


def record(path: Path, **files: str) -> Path:
    """A record directory holding ``files`` (name -> text)."""
    path.mkdir()
    for name, text in files.items():
        (path / name.replace("_", ".")).write_text(text)
    return path


def listing(path: Path) -> dict[str, str]:
    """The record's files, by name."""
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def test_a_first_record_is_renamed_into_place(tmp_path):
    staged = record(tmp_path / "lkg.staged", unit_service="u1", state_json="{}")
    assert load().commit(str(staged), str(tmp_path / "lkg")) is True
    assert listing(tmp_path / "lkg") == {"state.json": "{}", "unit.service": "u1"} and not staged.exists()


def test_a_new_record_replaces_the_whole_old_one_in_one_exchange(tmp_path):
    live = record(tmp_path / "lkg", unit_service="u1", api_key_yaml="k1", state_json="{1}")
    inode = live.stat().st_ino
    staged = record(tmp_path / "lkg.staged", unit_service="u2", state_json="{2}")
    assert load().commit(str(staged), str(live)) is True
    # The API key file the new state does not have is gone with the old record, not kept beside the new one.
    assert listing(live) == {"state.json": "{2}", "unit.service": "u2"}
    assert live.stat().st_ino != inode, "the directory itself is exchanged, not its files one by one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lkg"]


def test_the_same_record_changes_nothing(tmp_path):
    live = record(tmp_path / "lkg", unit_service="u1", state_json="{1}")
    inode = live.stat().st_ino
    staged = record(tmp_path / "lkg.staged", unit_service="u1", state_json="{1}")
    assert load().commit(str(staged), str(live)) is False
    assert live.stat().st_ino == inode and not staged.exists()


def test_without_rename_exchange_the_record_is_still_replaced_whole(tmp_path, monkeypatch):
    module = load()

    def unsupported(a: str, b: str) -> None:
        raise OSError(errno.EINVAL, "no RENAME_EXCHANGE", a)

    monkeypatch.setattr(module.durable, "exchange", unsupported)
    live = record(tmp_path / "lkg", unit_service="u1", state_json="{1}")
    staged = record(tmp_path / "lkg.staged", unit_service="u2", state_json="{2}")
    assert module.commit(str(staged), str(live)) is True
    assert listing(live) == {"state.json": "{2}", "unit.service": "u2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lkg"]


def test_the_record_keeps_each_input_by_its_name_and_forgets_a_removed_one(tmp_path):
    unit, key = tmp_path / "unit.service", tmp_path / "api-key.yaml"
    unit.write_text("[Service]\n")
    files = [
        {"path": str(unit), "lkg_name": "unit.service", "absent": "keep", "secret": False},
        {"path": str(key), "lkg_name": "api-key.yaml", "absent": "remove", "secret": True},
    ]
    wanted = load().record_contents(files, {"b": 1, "a": [2]})
    assert wanted == {
        "unit.service": b"[Service]\n",
        "state.json": b'{\n    "a": [\n        2\n    ],\n    "b": 1\n}\n',
    }
    # An input that must be there (absent: keep) and is missing: nothing is recorded.
    unit.unlink()
    with pytest.raises(FileNotFoundError):
        load().record_contents(files, {})


def test_the_staged_record_is_root_only(tmp_path):
    staged = tmp_path / "lkg.staged"
    staged.mkdir()
    (staged / "left-over").write_text("from a killed deploy")
    load().stage(str(staged), {"unit.service": b"u", "state.json": b"{}"})
    assert listing(staged) == {"state.json": "{}", "unit.service": "u"}
    assert staged.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in staged.iterdir()} == {0o600}


def run_module(tmp_path: Path, *extra: str) -> dict:
    """Run last_known_good through ansible-playbook on localhost; its registered result."""
    (tmp_path / "unit.service").write_text((tmp_path / "unit.txt").read_text())
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "last_known_good": {
                        "dir": str(tmp_path / "lkg"),
                        "staged_dir": str(tmp_path / "lkg.staged"),
                        "files": [
                            {"path": str(tmp_path / "unit.service"), "lkg_name": "unit.service", "absent": "keep"}
                        ],
                        "state": {"engine": "transformers"},
                    },
                    "register": "recorded",
                },
                {
                    "ansible.builtin.copy": {
                        "content": "{{ recorded | to_json }}",
                        "dest": str(tmp_path / "result.json"),
                    },
                    "check_mode": False,
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_LIBRARY=str(ROLE / "library"),
    )
    run = subprocess.run(
        [*LOCALHOST_PLAYBOOK, *extra, str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((tmp_path / "result.json").read_text())


def test_the_module_records_once_then_changes_nothing_and_check_mode_writes_nothing(tmp_path):
    (tmp_path / "unit.txt").write_text("[Service]\nEnvironment=A=1\n")
    first = run_module(tmp_path)
    assert first["changed"] is True and first["names"] == ["state.json", "unit.service"]
    assert listing(tmp_path / "lkg")["unit.service"] == "[Service]\nEnvironment=A=1\n"
    assert run_module(tmp_path)["changed"] is False
    (tmp_path / "unit.txt").write_text("[Service]\nEnvironment=A=2\n")
    assert run_module(tmp_path, "--check")["changed"] is True
    assert listing(tmp_path / "lkg")["unit.service"] == "[Service]\nEnvironment=A=1\n"
    assert not (tmp_path / "lkg.staged").exists()


def rollback(tmp_path: Path, state: dict) -> subprocess.CompletedProcess:
    """Run tasks/rollback.yml against a record in ``tmp_path`` (deploy dir tmp_path/deploy)."""
    lkg = tmp_path / "deploy" / "last-known-good"
    lkg.mkdir(parents=True)
    (lkg / "state.json").write_text(json.dumps(state))
    (lkg / "unit.service").write_text("[Service]\n")
    variables = {
        "inference_server_unit_name": "lkg-test-no-such-unit",
        "inference_server_deploy_dir": str(tmp_path / "deploy"),
        "inference_server_rollback_reason": "The gate failed.",
        "inference_server_plan": {"argv": [], "env": {}, "notes": []},
    }
    return run_role_tasks(tmp_path, variables, ["rollback.yml"], check_mode=False)


@pytest.mark.parametrize("missing", ["venv", "model"])
def test_a_rollback_to_a_record_whose_files_are_gone_is_refused_before_the_links_move(tmp_path, missing):
    venv, model, link = tmp_path / "venv-old", tmp_path / "model-old", tmp_path / "ml-env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    model.mkdir()
    (tmp_path / "venv-new").mkdir()
    link.symlink_to(tmp_path / "venv-new")
    if missing == "venv":
        (venv / "bin" / "python").unlink()
    else:
        model.rmdir()
    state = {"venv_dir": str(venv), "ml_env_path": str(link), "model_dir": str(model), "model_revision": "r1"}
    state |= {"venv_lock": "transformers-cpu.txt", "model_current_link": "", "engine": "transformers"}
    run = rollback(tmp_path, state)
    assert run.returncode != 0
    gone = str(venv / "bin" / "python") if missing == "venv" else str(model)
    assert (
        f"The gate failed. Rolling back is refused: the last-known-good {missing} ({gone}) is missing on this host"
        in " ".join(run.stdout.split())
    ), run.stdout[-3000:]
    assert os.readlink(link) == str(tmp_path / "venv-new"), "the venv link must not move to a missing directory"


@pytest.mark.parametrize("drop", ["", "file", "directory"], ids=["as-written", "no-file-fsync", "no-directory-fsync"])
@pytest.mark.parametrize("first", [True, False], ids=["first-record", "exchanged"])
def test_the_record_survives_a_power_cut_once_written(tmp_path, monkeypatch, first, drop):
    """Each staged file and the staged directory on disk before the exchange, the deploy directory after it."""
    module, live = load(), tmp_path / "lkg"
    if not first:
        record(live, unit_service="u1", state_json="{1}")
    with durability.recorded(monkeypatch, exchanges=((module.durable, "exchange"),), drop=drop) as events:
        module.stage(str(tmp_path / "lkg.staged"), {"unit.service": b"u2", "state.json": b"{2}"})
        assert module.commit(str(tmp_path / "lkg.staged"), str(live)) is True
    lost = durability.lost_on_power_cut(events, str(live))
    assert bool(lost) == bool(drop), lost


# The server by hand as roles/adopt's baseline exports it (adopt_take_over) for inference_server_take_over.
TAKE_OVER = {
    "pid": 4242,
    "start_ticks": 777,
    "argv": ["/root/ml-env/bin/python", "/root/ml-env/bin/transformers", "serve", "/root/models/tiny"],
    "user": "root",
    "cwd": "/root",
    "venv": "/root/ml-env",
    "model_dir": "/root/models/tiny",
    "record_dir": "/var/lib/inference-server-deploy/adopt",
    "restore_unit": "inference-server-by-hand",
    "stop_timeout_s": 60,
    "baseline": {"decode_tps_mean": 21.5, "summary": "gate PASS"},
    # Those of its gate's report (a few of them here).
    "gate_thresholds": {"min_decode_tps": 0, "max_ttft_s": 0, "min_eval_score": 0.9, "eval_margin_pct": 10},
}


def record_good(tmp_path: Path, **variables: object) -> subprocess.CompletedProcess:
    """inference_server's record_good entry point on localhost, the deploy directory in ``tmp_path``."""
    (tmp_path / "deploy").mkdir(exist_ok=True)
    base = {"inference_server_deploy_dir": str(tmp_path / "deploy"), "ml_env_path": "/root/ml-env"}
    return run_role_tasks(tmp_path, {**base, **variables}, ["record_good.yml"], check_mode=False)


def test_a_server_run_by_hand_is_recorded_whole_through_the_module(tmp_path):
    """Adopting: the record of the server by hand is written by the record's one writer (issue 45), and
    replaces an older record of ours whole: no unit of ours is kept beside it."""
    record(tmp_path / "deploy", unit_service="[Service]\n", state_json='{"kind": "unit"}')
    run = record_good(tmp_path, health_gate_passed=True, inference_server_take_over=TAKE_OVER)
    assert run.returncode == 0, run.stdout[-3000:]
    lkg = tmp_path / "deploy" / "last-known-good"
    assert sorted(p.name for p in lkg.iterdir()) == ["state.json"]
    state = json.loads((lkg / "state.json").read_text())
    assert state == {
        "kind": "by-hand",
        "engine": "sglang (by hand)",
        "engine_version": "",
        "venv_dir": "/root/ml-env",
        "venv_lock": "by-hand",
        "ml_env_path": "/root/ml-env",
        "model_dir": "/root/models/tiny",
        "model_revision": "by-hand",
        "model_current_link": "",
        "argv": TAKE_OVER["argv"],
        "pid": 4242,
        "user": "root",
        "cwd": "/root",
        "port": 30000,
        "adopt_dir": "/var/lib/inference-server-deploy/adopt",
        "restore_unit": "inference-server-by-hand",
        "baseline": TAKE_OVER["baseline"],
        "gate_thresholds": TAKE_OVER["gate_thresholds"],
    }
    assert (lkg / "state.json").stat().st_mode & 0o777 == 0o600


def test_nothing_is_recorded_that_no_gate_passed_in_the_run(tmp_path):
    run = record_good(tmp_path, inference_server_take_over=TAKE_OVER)
    assert run.returncode != 0
    assert (
        "inference_server's record_good records the server that serves as last-known-good only after it passed the "
        "gate in this run (health_gate_passed is not set): gate it first"
    ) in " ".join(run.stdout.split()), run.stdout[-3000:]
    assert not (tmp_path / "deploy" / "last-known-good").exists()
