"""After two failing deploys the host is back on its previous state, serving, with the
failed attempts on record and one message per failure saying so."""

from __future__ import annotations

import json

import pytest

# molecule/shared: the helpers of every scenario's verifier (molecule/shared/verify_steps.py).
from verify_steps import ephemeral, failed_output, recorded

UNIT = "inference-server"
DEPLOY_DIR = f"/var/lib/{UNIT}-deploy"


def run_of(case: str) -> dict:
    """Exit code and output of one failing deploy from side_effect.yml."""
    return recorded(f"rollback-{case}.json")


@pytest.mark.parametrize(
    "case, evidence",
    [
        ("engine_refuses_start", "Unsupported attention implementation: 'no_such_attention'"),
        (
            "capacity_capped",
            "runs at most 1 request at once (server_info effective_max_running_requests_per_dp; "
            "4 asked), below min_running_requests 2",
        ),
        ("threshold_not_met", "is below min_decode_tps"),
    ],
)
def test_failed_deploy_says_what_failed_and_that_the_host_is_back(case, evidence):
    run = run_of(case)
    out = failed_output(run)
    assert "failed on molecule-rollback:" in out
    assert evidence in out
    assert "The host is back on its last-known-good state" in out
    assert "and serving: gate PASS" in out
    # The failed change restarted the server, and the rollback restarted it again.
    assert run["started_after"] != run["started_before"]


def test_an_upgrade_that_says_other_things_is_refused_and_the_host_is_back():
    """The same model on an engine that says other things, as fast: its eval is right, its golden
    outputs are not the last-known-good's."""
    run = run_of("outputs_differ")
    out = failed_output(run)
    assert "golden outputs differ from the last-known-good's on 5 of 5 prompts (code from character 0" in out
    refused = [line for line in out.splitlines() if "gate FAIL:" in line][0]
    assert "tok/s decode" in refused and "is below min_decode_tps" not in refused
    assert "The host is back on its last-known-good state" in out and "and serving: gate PASS" in out
    # The restored server is asked the probe again (correctness always) and says what it said before.
    assert "right: golden 5/5" in out.split("The host is back on its last-known-good state")[-1]
    assert run["venv_after"] == run["venv_before"]


def test_the_deploy_after_a_rollback_runs_only_the_role_whose_inputs_changed():
    # threshold_not_met follows capacity_capped, whose rescue put back the converged record
    # of the last-known-good state before rolling the host back to it: the venv and the model are
    # as that record says, so only the server, whose environment the case changes, runs.
    # The yaml callback quotes the verdict: '' stands for one quote.
    out = failed_output(run_of("threshold_not_met")).replace("''", "'")
    assert "Skipping ml_env and model_sync, as the last converged deploy left them; running inference_server:" in out
    assert "The deploy's inputs changed: variables of role inference_server." in out
    assert "TASK [ml_env : Compare the installed packages with the lock]" not in out


def test_a_plan_the_engine_refuses_leaves_the_server_untouched():
    run = run_of("engine_check_refuses")
    out = failed_output(run)
    assert "refused by the engine's own check" in out
    assert "Nothing to roll back: the unit and its secrets are the last-known-good ones" in out
    assert run["started_after"] == run["started_before"]


def test_unit_on_disk_is_the_last_known_good_one(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}.service")
    kept = host.file(f"{DEPLOY_DIR}/last-known-good/unit.service")
    assert unit.sha256sum == kept.sha256sum
    assert "not-a-dtype" not in unit.content_string
    assert "ROLLBACK_CASE" not in unit.content_string


def test_service_is_active_and_answering(host):
    assert host.service(UNIT).is_running
    model = host.file("/srv/models/tiny-qwen3.5/current").linked_to
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "def add(a, b):"}], "max_tokens": 8, "temperature": 0}
    )
    answer = host.run(
        f"curl -sf -H 'content-type: application/json' -d '{body}' http://127.0.0.1:8000/v1/chat/completions"
    )
    assert answer.rc == 0, answer.stderr
    assert json.loads(answer.stdout)["usage"]["completion_tokens"] > 0


def test_gate_history_shows_the_failed_attempts(host):
    reports = host.run(f"cat {DEPLOY_DIR}/gate/2*.json").stdout
    decoder, found, index = json.JSONDecoder(), [], 0
    while index < len(reports):
        report, index = decoder.raw_decode(reports, index)
        found.append(report)
        while index < len(reports) and reports[index].isspace():
            index += 1
    failed = [r for r in found if not r["passed"]]
    assert len(failed) >= 2
    assert any("no_such_attention" in json.dumps(r.get("evidence")) for r in failed)
    assert any(r["thresholds"]["min_decode_tps"] == 1000000 for r in failed)
    # Every failure was followed by a passing gate of the restored state.
    assert found[-1]["passed"] is True


# --------------------------------------------------------------------------------------
# The relative gate and the bake-off (tasks/relative_gate.yml)
# --------------------------------------------------------------------------------------


def test_a_slower_model_passes_with_the_relative_gate_off():
    run = run_of("slower_model_accepted")
    assert run["rc"] == 0, run["output"][-3000:]


def bakeoff_table() -> dict:
    """The bake-off's table as the playbook wrote it on the controller."""
    return recorded("bakeoff/molecule-rollback/bakeoff.json")


def test_the_bakeoff_keeps_the_faster_candidate():
    run = recorded("bakeoff-run.json")
    assert run["rc"] == 0, run["output"][-3000:]
    table = bakeoff_table()
    incumbent, candidate = table["rows"]
    # The 32-layer incumbent may miss the TTFT threshold at concurrency 2; its single-stream gate passed.
    assert incumbent["incumbent"] and incumbent["single"]["passed"], incumbent
    assert candidate["name"] == "four-layers" and candidate["passed"], candidate
    # Single-stream and at concurrency 2, on the same prompts.
    assert incumbent["single"]["concurrency"] == candidate["single"]["concurrency"] == 1
    assert incumbent["concurrent"]["concurrency"] == candidate["concurrent"]["concurrency"] == 2
    assert candidate["single"]["decode_tps_mean"] > 1.1 * incumbent["single"]["decode_tps_mean"]
    assert table["winner"] == "four-layers" and table["kept"] is True
    out = " ".join(run["output"].split())
    assert "four-layers deployed as the new last-known-good" in out
    md = ephemeral("bakeoff/molecule-rollback/bakeoff.md").read_text()
    assert "| four-layers | yes |" in md and "Decision: four-layers beat the last-known-good" in md


def test_the_bakeoff_table_is_on_the_host_too(host):
    table = json.loads(host.file(f"{DEPLOY_DIR}/bakeoff/bakeoff.json").content_string)
    assert table == bakeoff_table()
    assert host.file(f"{DEPLOY_DIR}/bakeoff/bakeoff.md").mode == 0o600


def test_the_slower_model_is_refused_by_the_relative_gate_and_rolled_back():
    run = run_of("slower_model_refused")
    assert run["rc"] != 0
    out = " ".join(run["output"].split())
    assert "failed on molecule-rollback:" in out
    assert "below the last-known-good's" in out and "(max_regression_pct " in out
    assert "The host is back on its last-known-good state" in out
    assert "and serving: gate PASS" in out
    assert run["started_after"] != run["started_before"]


def test_the_host_ends_on_the_four_layer_model(host):
    state = json.loads(host.file(f"{DEPLOY_DIR}/last-known-good/state.json").content_string)
    config = json.loads(host.file(f"{state['model_dir']}/config.json").content_string)
    assert config["num_hidden_layers"] == 4
    assert host.file("/srv/models/tiny-qwen3.5/current").linked_to == state["model_dir"]
    # The last-known-good keeps the figures the next deploy's relative gate compares with.
    baseline = state["gate_baseline"]
    assert baseline["decode_tps_mean"] > 0 and baseline["requests"] == 4 and baseline["unit_sha256"]


# --------------------------------------------------------------------------------------
# The engine upgrade as a gated candidate (playbooks/upgrade.yml, transformers 5.6.0 -> 5.6.2)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["engine_refuses_start", "capacity_capped", "slower_model_refused"])
def test_a_failed_upgrade_goes_back_to_the_previous_engine_and_keeps_the_candidates_venv(host, case):
    run = run_of(case)
    assert run["rc"] != 0
    out = " ".join(run["output"].split())
    assert "The host is back on its last-known-good state" in out
    # The link points at the venv the host ran before; the candidate's venv was built beside it.
    assert run["venv_after"] == run["venv_before"], run
    assert "transformers-cpu-5.6.2" in out


def test_the_capacity_was_read_from_the_candidate_and_again_after_the_rollback(host):
    # The cap stand-in logs each server_info it answered: the candidate's gate read the
    # capped limit of 5.6.2, and the rollback's re-gate the full one of 5.6.0, which passed.
    log = host.run("journalctl -u rb-cap-engine --no-pager -o cat").stdout
    answered = [line for line in log.splitlines() if line.startswith("server_info:")]
    capped = "server_info: transformers 5.6.2, effective_max_running_requests_per_dp 1"
    assert capped in answered, log[-2000:]
    after = answered[answered.index(capped) :]
    assert "server_info: transformers 5.6.0, effective_max_running_requests_per_dp 4" in after, log[-2000:]
    # The measurement went through to the real server (streamed chat completions).
    assert "POST /v1/chat/completions" in log


def test_the_upgrade_that_passes_its_gate_is_kept_and_the_previous_venv_stays(host):
    run = run_of("upgrade_kept")
    assert run["rc"] == 0, run["output"][-3000:]
    assert run["venv_after"] != run["venv_before"]
    state = json.loads(host.file(f"{DEPLOY_DIR}/last-known-good/state.json").content_string)
    assert state["engine_version"] == "5.6.2" and state["venv_lock"] == "transformers-cpu-5.6.2"
    assert state["venv_dir"] == run["venv_after"]
    assert host.file(run["venv_before"]).is_directory, "the previous engine's venv is kept for going back"
    installed = host.run(f"{run['venv_after']}/bin/python -c 'import transformers; print(transformers.__version__)'")
    assert installed.stdout.strip() == "5.6.2", installed.stderr


def test_a_deploy_with_the_older_lock_never_changes_the_engine_on_its_own():
    run = run_of("deploy_keeps_engine")
    assert run["rc"] != 0
    out = " ".join(run["output"].split())
    assert "gives transformers 5.6.0, but molecule-rollback runs 5.6.2 (its last-known-good state)" in out
    assert "an engine change is a gated candidate" in out
    assert run["started_after"] == run["started_before"] and run["venv_after"] == run["venv_before"]
