"""tools/gpu-acceptance upgrade on the CPU: the real gate (tools/health-gate) against two installed
stand-ins for SGLang (tests/tools/test_gpu_tools.py's FAKE_SERVER), one per engine bundle, whose
token pace and running-request limit the plan's environment sets. SGLang itself only runs on a GPU
host (bench/results/upgrade-gpu-*.md); what is proven here is the runner's decision: a candidate as
fast as the baseline is kept, a slower or capacity-capped one is rolled back and the previous
engine serves again, gated against the same baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from deploytools import gpu_acceptance as ga
from test_gpu_tools import fake_bundle, free_port

# Small gates: two measured requests of 12 tokens, one at a time, no warm-up.
GATE_ARGS = ["--requests", "2", "--warmup", "0", "--max-tokens", "12", "--concurrency", "1", "--ready-timeout", "30"]
PACE_S = 0.02


def upgrade_args(candidate_state: Path, **changes: object) -> argparse.Namespace:
    """The command line of ``gpu-acceptance upgrade`` as parsed, with ``changes``."""
    values: dict[str, object] = {
        "candidate_state": candidate_state,
        "candidate_plan": None,
        "name": "t",
        "baseline_gates": 3,
        "baseline": None,
        "baseline_only": False,
        "gate_arg": [],
        "max_regression_pct": 10.0,
        "min_running_requests": 0,
        "timeout": 60,
    }
    values.update(changes)
    return argparse.Namespace(**values)


def installed(root: Path, port: int, env: dict[str, str]) -> ga.device.Device:
    """A state folder with the fake engine received and installed from its own bundle."""
    dev = ga.device.Device(root / "state")
    assert ga.device.cmd_receive(argparse.Namespace(folder=fake_bundle(root, port, env, GATE_ARGS)), dev) == 0
    assert ga.install.cmd_install(argparse.Namespace(), dev) == 0
    return dev


@pytest.mark.parametrize(
    ("candidate_env", "verdict", "failed_check"),
    [
        ({"FAKE_TOKEN_DELAY_S": str(PACE_S), "FAKE_VERSION": "0.5.17"}, "kept", None),
        ({"FAKE_TOKEN_DELAY_S": str(PACE_S * 3), "FAKE_VERSION": "0.5.17"}, "rolled_back", "decode"),
        ({"FAKE_TOKEN_DELAY_S": str(PACE_S), "FAKE_VERSION": "0.5.17", "FAKE_RUNNING": "1"}, "rolled_back", "running"),
    ],
    ids=["as-fast-kept", "slower-rolled-back", "capacity-capped-rolled-back"],
)
def test_upgrade_keeps_or_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, candidate_env: dict[str, str], verdict: str, failed_check: str
) -> None:
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    port = free_port()
    running = installed(tmp_path / "running", port, {"FAKE_TOKEN_DELAY_S": str(PACE_S), "FAKE_RUNNING": "4"})
    candidate = installed(tmp_path / "candidate", port, candidate_env)
    ns = argparse.Namespace
    try:
        assert ga.processes.cmd_launch(ns(name="running"), running) == 0
        assert ga.processes.cmd_wait(ns(name="running", timeout=30, interval=0.2), running) == 0
        code = ga.upgrade.cmd_upgrade(
            upgrade_args(candidate.root, max_regression_pct=25.0, min_running_requests=4),
            running,
        )
    finally:
        for dev in (running, candidate):
            for record in dev.load().get("servers", {}).values():
                ga.processes.stop_session(record["pid"], grace_s=5)
    record = json.loads((running.root / "upgrade-t.json").read_text())
    assert code == 0, record
    assert record["verdict"] == verdict
    gates = record["baseline"]["gates"]
    assert len(gates) == 3 and all(g["decode_tps"] for g in gates)
    assert record["baseline"]["decode_tps_spread_pct"] is not None
    assert record["candidate_gate"]["passed"] is (verdict == "kept")
    if verdict == "kept":
        assert candidate.server("running")["argv"][0] == record["candidate_argv"][0]
        assert "rollback_start" not in record
    else:
        assert any(failed_check in reason for reason in record["candidate_gate"]["reasons"]), record["candidate_gate"]
        assert record["rollback_start"]["ready"] and record["rollback_gate"]["passed"]
        assert running.server("running")["argv"][0] == record["running_argv"][0]
    assert Path(record["metrics_candidate"]).read_text().startswith("sglang:")


def test_upgrade_refuses_a_candidate_from_the_running_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    dev = installed(tmp_path / "running", free_port(), {})
    dev.set_server("running", {"argv": dev.plan().argv, "pid": 0, "url": "http://127.0.0.1:1"})
    with pytest.raises(ga.common.AcceptanceError, match="nothing to upgrade"):
        ga.upgrade.cmd_upgrade(
            upgrade_args(dev.root, baseline_gates=1, timeout=10),
            dev,
        )


def test_a_real_config_keeps_the_tiny_tokenizers_vision_ids(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"image_token_id": 7, "hidden_size": 8}))
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"image_token_id": 248056, "hidden_size": 5120, "num_hidden_layers": 64}))
    ga.install.use_model_config(model, real)
    served = json.loads((model / "config.json").read_text())
    assert served == {"image_token_id": 7, "hidden_size": 5120, "num_hidden_layers": 64}
    ga.install.use_model_config(model, real)  # again: the tiny config kept aside is not overwritten
    assert json.loads((model / "config.tiny.json").read_text())["hidden_size"] == 8
    ga.install.use_tiny_config(model)
    assert json.loads((model / "config.json").read_text())["hidden_size"] == 8


def correctness_args(steps: str | None = None, **more: object) -> argparse.Namespace:
    """The command line of ``gpu-acceptance correctness --name t`` as parsed, with ``--steps``."""
    given = {"reference": None, "gate_arg": [], "timeout": 60, "gates": 1, "streams": 8, "perturbed_model": None}
    given["setting"] = []
    return argparse.Namespace(name="t", steps=steps, **{**given, **more})


def test_correctness_relaunches_turns_speculation_off_and_measures_the_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gpu-acceptance correctness`` against the stand-in SGLang whose toy model flips near-ties when
    speculative decoding is off (as a kernel change would): the same plan started again says the same,
    the plan without NEXTN parts at near-ties only, and both are measured with the real gate's probe."""
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "FAKE_LM_NO_SPEC_MODE": "near_tie"}
    dev = installed(tmp_path / "running", free_port(), env)
    try:
        code = ga.correctness.cmd_correctness(correctness_args(), dev)
    finally:
        for record in dev.load().get("servers", {}).values():
            ga.processes.stop_session(record["pid"], grace_s=5)
    record = json.loads((dev.root / "correctness-t.json").read_text())
    assert code == 0, record
    first, again, no_spec = record["first"]["gate"], record["again"]["gate"], record["no_spec"]["gate"]
    assert first["golden_prompts"] is None and all(row["repeat_differs_at"] is None for row in first["consistency"])
    assert any(row["cached_tokens"] for row in first["consistency"])
    assert again["passed"] and again["golden_same"] == again["golden_prompts"] == 7 and again["drift_max"] == 0.0
    assert no_spec["golden_same"] < 7 and no_spec["golden_near_ties"] == 7 - no_spec["golden_same"]
    assert no_spec["passed"] and 0 < no_spec["drift_max"] <= 0.05


def test_correctness_steps_spread_over_calls_keep_one_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose calls are limited in time runs the steps in two invocations: the second compares
    with the first step recorded by the first, and the record keeps both calls' steps, with the figures
    of every golden and consistency row."""
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    dev = installed(
        tmp_path / "running", free_port(), {"SGLANG_ENABLE_SPEC_V2": "1", "FAKE_LM_NO_SPEC_MODE": "near_tie"}
    )
    with pytest.raises(ga.common.AcceptanceError, match="run --steps first before the others"):
        ga.correctness.cmd_correctness(correctness_args("again"), dev)
    with pytest.raises(ga.common.AcceptanceError, match="unknown step"):
        ga.correctness.cmd_correctness(correctness_args("first,twice"), dev)
    try:
        assert ga.correctness.cmd_correctness(correctness_args("first"), dev) == 0
        first_call = json.loads((dev.root / "correctness-t.json").read_text())
        assert "again" not in first_call and "no_spec" not in first_call
        assert ga.correctness.cmd_correctness(correctness_args("no-spec,again"), dev) == 0
    finally:
        for record in dev.load().get("servers", {}).values():
            ga.processes.stop_session(record["pid"], grace_s=5)
    record = json.loads((dev.root / "correctness-t.json").read_text())
    assert record["steps"] == ["no-spec", "again"] and record["first"] == first_call["first"]
    assert [row["ok"] for row in record["again"]["gate"]["golden"]] == [True] * 7
    parted = [row for row in record["no_spec"]["gate"]["golden"] if not row["same"]]
    assert parted and all(row["near_tie"] and row["margin_at_divergence"] <= 0.2 for row in parted)
    assert all(row["drift"] is not None and row["first_divergence"] is not None for row in parted)
    assert all(step["seconds"] > 0 and step["start"]["ready_s"] for step in (record["again"], record["no_spec"]))
    assert {row["id"] for row in record["first"]["gate"]["consistency"]} == {"code", "doc/3", "talk/2"}
    decisions = record["first"]["gate"]["decisions"]
    assert decisions["tokens"] == 7 * 32 and decisions["margin"]["min"] <= decisions["margin"]["median"]
    assert decisions["chosen_logprob"]["max"] <= 0


def test_correctness_gates_each_start_many_times_under_traffic_and_refuses_another_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--gates 2``: the first step's second gate compares with the first's report (written before it
    runs); ``traffic`` gates while clients send chat requests; ``perturbed`` serves another model path
    (the stand-in answers every question wrong there) and ``setting`` the plan with a lossy KV cache
    (the stand-in's tokens break), and the gates of both are refused against ``first``."""
    monkeypatch.setattr(ga.install, "IMPORT_CHECK", "print('{\"import_s\": 0}')")
    dev = installed(tmp_path / "running", free_port(), {"SGLANG_ENABLE_SPEC_V2": "1"})
    with pytest.raises(ga.common.AcceptanceError, match="needs --perturbed-model"):
        ga.correctness.cmd_correctness(correctness_args("perturbed"), dev)
    with pytest.raises(ga.common.AcceptanceError, match="needs --setting"):
        ga.correctness.cmd_correctness(correctness_args("setting"), dev)
    other = tmp_path / "model-perturbed"
    lossy = ["--kv-cache-dtype=fp8_e5m2"]
    args = correctness_args("first,traffic,perturbed,setting", gates=2, streams=3, perturbed_model=other, setting=lossy)
    try:
        assert ga.correctness.cmd_correctness(args, dev) == 0
    finally:
        for record in dev.load().get("servers", {}).values():
            ga.processes.stop_session(record["pid"], grace_s=5)
    record = json.loads((dev.root / "correctness-t.json").read_text())
    first, traffic, perturbed, setting = (record[step] for step in ("first", "traffic", "perturbed", "setting"))
    assert first["gate"]["golden_prompts"] is None, "the first gate had no reference"
    [second] = first["gates"]
    assert second["passed"] and second["golden_same"] == 7 and second["eval_paired"]["worse"] == 0
    assert all(g["passed"] for g in [traffic["gate"], *traffic["gates"]])
    assert traffic["traffic"]["requests"] > 0 and traffic["traffic"]["errors"] == 0
    assert "traffic" not in first and "traffic" not in perturbed
    assert perturbed["argv"][perturbed["argv"].index("--model-path") + 1] == str(other)
    for refused in [perturbed["gate"], *perturbed["gates"]]:
        assert not refused["passed"] and refused["eval_paired"]["worse"] > 0 and not refused["eval_paired"]["ok"]
    assert setting["argv"][-1] == "--kv-cache-dtype=fp8_e5m2" and "--kv-cache-dtype=fp8_e5m2" not in first["argv"]
    for refused in [setting["gate"], *setting["gates"]]:
        assert not refused["passed"] and refused["golden_same"] < 7


def test_spread_reads_quantiles_off_the_sorted_values() -> None:
    assert ga.correctness.spread([]) is None
    figures = ga.correctness.spread([float(v) for v in range(10, -1, -1)])
    assert figures == {"min": 0.0, "p10": 1.0, "median": 5.0, "p90": 9.0, "max": 10.0}


def test_without_speculation_drops_the_speculative_flags_and_the_spec_v2_switch() -> None:
    plan = ga.common.Plan(
        ["/v/bin/sglang", "serve", "--model-path", "/m", "--speculative-algorithm", "NEXTN",
         "--speculative-num-steps", "3", "--speculative-eagle-topk=1", "--mamba-scheduler-strategy", "extra_buffer"],
        {"SGLANG_ENABLE_SPEC_V2": "1", "HF_HOME": "/h"},
        [],
    )  # fmt: skip
    off = ga.correctness.without_speculation(plan)
    assert off.argv == ["/v/bin/sglang", "serve", "--model-path", "/m", "--mamba-scheduler-strategy", "extra_buffer"]
    assert off.env == {"HF_HOME": "/h"} and plan.env["SGLANG_ENABLE_SPEC_V2"] == "1"
