"""After two failing deploys the host is back on its previous state, serving, with the
failed attempts on record and one message per failure saying so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# molecule/shared: the helpers of every scenario's verifier (molecule/shared/verify_steps.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared"))
from verify_steps import failed_output, recorded  # noqa: E402

UNIT = "inference-server"
DEPLOY_DIR = f"/var/lib/{UNIT}-deploy"


def run_of(case: str) -> dict:
    """Exit code and output of one failing deploy from side_effect.yml."""
    return recorded(f"rollback-{case}.json")


@pytest.mark.parametrize(
    "case, evidence",
    [
        ("engine_refuses_start", "Unsupported attention implementation: 'no_such_attention'"),
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
