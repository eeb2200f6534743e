"""The last-known-good record of a server run by hand keeps the thresholds adopt's gate judged it by, and a
rollback to it gates it by them (inference_server's rollback_by_hand.yml).

deploy.yml's adoption up to the record (roles/adopt's inspect and baseline, inference_server's record_good)
and then inference_server's rollback run with ansible-playbook on localhost against a server by hand that
speaks SGLang's API (tests/shared/fake_sglang_lm.py, a process of its own), measured by the real health
gate. No systemd is needed: the server by hand never stops, so the rollback starts nothing. The
molecule scenario ``adopt`` runs the adoption on a systemd host.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from role_files import REPO, ansible_env, run_role_tasks

# A server started by hand: SGLang's API over the toy model of tests/shared/fake_sglang_lm.py, in a
# process of its own with an environment of its own; SIGUSR1 makes it answer the eval's questions wrong.
TOY_BY_HAND = """
import signal
from fake_sglang_lm import FakeSGLangLM

server = FakeSGLangLM().start()

def answer_wrong(*_):
    server.mode = "wrong_answers"
    print("wrong_answers", flush=True)

signal.signal(signal.SIGUSR1, answer_wrong)
print(server.url, flush=True)
while True:
    signal.pause()
"""


def said_line(proc: subprocess.Popen) -> str:
    """The next line the server by hand prints, within 10 s ('' when it printed none)."""
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    return proc.stdout.readline().strip() if ready else ""


@pytest.fixture
def toy_by_hand(tmp_path):
    """The server by hand (TOY_BY_HAND), its port and process."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO / "tests" / "shared")}
    proc = subprocess.Popen(
        [sys.executable, "-c", TOY_BY_HAND], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    url = said_line(proc)
    yield {"proc": proc, "port": int(url.rsplit(":", 1)[1])}
    proc.kill()
    proc.wait()


def by_hand_variables(tmp_path: Path, port: int) -> dict:
    """The host's variables: the server by hand's port, the deploy directory in ``tmp_path``, a quick gate."""
    return {
        "inference_server_port": port,
        "inference_server_unit_name": "lkg-test-no-such-unit",
        "inference_server_deploy_dir": str(tmp_path / "deploy"),
        "ml_env_path": str(tmp_path / "ml-env"),
        # What preflight found on the port: a process outside our unit.
        "preflight_port_owner": {"listening": True, "user": "root", "unit": None},
        "health_gate_engine": "sglang",
        "health_gate_warmup_requests": 0,
        "health_gate_requests": 2,
        "health_gate_max_tokens": 8,
        "health_gate_ready_timeout_s": 30,
        "health_gate_request_timeout_s": 10,
        "health_gate_report_dir": str(tmp_path / "gate"),
        "health_gate_unit_file": str(tmp_path / "no-unit.service"),
        "health_gate_env_file": str(tmp_path / "no-secrets.env"),
        "health_gate_textfile_dir": "",
    }


def adopt_and_record(tmp_path: Path, variables: dict, eval_floor: float) -> subprocess.CompletedProcess:
    """deploy.yml's adoption up to the record: adopt's inspect and baseline (its gate), then inference_server's
    record_good with adopt_take_over, the inventory's eval floor ``eval_floor`` a play variable (as group_vars)."""
    calls = [
        {"ansible.builtin.include_role": {"name": "adopt", "tasks_from": "inspect.yml"}},
        {"ansible.builtin.include_role": {"name": "adopt", "tasks_from": "baseline.yml"}},
        {
            "ansible.builtin.include_role": {"name": "inference_server", "tasks_from": "record_good.yml"},
            "vars": {"inference_server_take_over": "{{ adopt_take_over }}"},
        },
    ]
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"health_gate_min_eval_score": eval_floor},
            "tasks": [dict(call, name=f"Run {call['ansible.builtin.include_role']['tasks_from']}") for call in calls],
        }
    ]
    (tmp_path / "adopt.yml").write_text(json.dumps(play))
    (tmp_path / "adopt-vars.json").write_text(json.dumps(variables))
    return subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "adopt.yml")]
        + ["-e", f"@{tmp_path / 'adopt-vars.json'}"],
        capture_output=True,
        text=True,
        env=ansible_env(),
        check=False,
    )


def test_a_rollback_to_the_server_by_hand_gates_it_by_the_eval_floor_its_adoption_used(tmp_path, toy_by_hand):
    """The by-hand record keeps the thresholds adopt's baseline gate judged the server by (the inventory's eval
    floor among them), and a rollback to it gates it by them, not by the floor the inventory has then (here
    health_gate's default 0). A record of an older version, without min_eval_score, still rolls back: no floor."""
    variables = by_hand_variables(tmp_path, toy_by_hand["port"])
    adopted = adopt_and_record(tmp_path, variables, eval_floor=0.5)
    assert adopted.returncode == 0, adopted.stdout[-4000:]
    state_file = tmp_path / "deploy" / "last-known-good" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["kind"] == "by-hand" and state["pid"] == toy_by_hand["proc"].pid
    thresholds = state["gate_thresholds"]
    assert thresholds["min_eval_score"] == 0.5, thresholds
    assert thresholds["min_decode_tps"] == 0 == thresholds["max_ttft_s"], "the baseline gate had no speed floor"

    # The server by hand now answers wrong: the eval floor it was adopted with fails it.
    os.kill(toy_by_hand["proc"].pid, signal.SIGUSR1)
    assert said_line(toy_by_hand["proc"]) == "wrong_answers"
    variables["inference_server_rollback_reason"] = "The gate failed."
    run = run_role_tasks(tmp_path, variables, ["rollback.yml"], check_mode=False)
    said = " ".join(run.stdout.split())
    assert run.returncode != 0
    assert "The gate failed. Putting back the server that ran by hand (never stopped, pid" in said, said[-3000:]
    assert "did not pass the gate either" in said and "is below min_eval_score 0.5" in said, said[-3000:]

    # The same record as an older version wrote it: judged on health, with no eval floor.
    del state["gate_thresholds"]["min_eval_score"]
    state_file.write_text(json.dumps(state))
    run = run_role_tasks(tmp_path, variables, ["rollback.yml"], check_mode=False)
    said = " ".join(run.stdout.split())
    assert run.returncode != 0, "the rollback fails the play with its reason once the server serves"
    assert "The gate failed, so the host is back on the server that ran by hand (never stopped" in said, said[-3000:]
    assert "and serving: gate PASS" in said, said[-3000:]
