"""The memory budget by SGLang 0.5.17's rules (tools/deploytools/launch_plan/pools.py ``RULES["0.5.17"]``)
against what SGLang 0.5.17 logged.

SGLang 0.5.17 started the bench's cases at Qwen3.6-27B's real size on one H200
(tests/launch_plan/fixtures/sglang_0517_realsize_h200_logged.json, from bench/results/realsize-0.5.17.json):
it loads the MTP draft before sizing its pools, solves its mamba slots and verify buffers together
and caps the running requests to its mamba slots instead of refusing. The budget must reproduce
each figure of the cases that started within 5 %, and not start the case SGLang did not start;
the plan must refuse, in one sentence naming the variable to change, a cap below
target_concurrency and the case SGLang did not start, and say loudly when 0.5.17 will cap.
0.5.11's figures stay test_launch_plan_budget.py's.
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

import pytest
from launch_plan_cases import REPO, profile_settings

LOGGED = json.loads((REPO / "tests" / "launch_plan" / "fixtures" / "sglang_0517_realsize_h200_logged.json").read_text())
CASES = {case["name"]: case for case in LOGGED["cases"]}
STARTED = [name for name, case in CASES.items() if case["outcome"] == "started"]
GIB = 1024**3
TOLERANCE = 0.05
# bench/realsize's host h200-realsize-0517 (inventory/gpu-realsize.yml): TP 1, flashinfer, dummy weights.
REALSIZE_OVERRIDES = {"--tensor-parallel-size": 1, "--attention-backend": "flashinfer", "--load-format": "dummy"}


def close(predicted: float, logged: float, tolerance: float = TOLERANCE) -> bool:
    return abs(predicted - logged) <= tolerance * abs(logged)


@pytest.fixture(scope="module")
def budget(launch_plan: ModuleType) -> ModuleType:
    """deploytools.launch_plan.budget (its PlanError is deploytools.launch_plan.errors')."""
    return importlib.import_module("deploytools.launch_plan.budget")


@pytest.fixture(scope="module")
def common(launch_plan: ModuleType) -> ModuleType:
    """deploytools.launch_plan.common."""
    return importlib.import_module("deploytools.launch_plan.common")


@pytest.fixture(scope="module")
def geo(budget: ModuleType, qwen_config: dict[str, Any]) -> Any:
    return budget.geometry(qwen_config)


def launch_of(budget: ModuleType, common: ModuleType, argv: list[str], rules: str = "0.5.17") -> Any:
    """The Launch that SGLang 0.5.17's argv describes, read the plan's way (launch_from_flags, 0.5.17's table)."""
    flags = common.FlagSet(common.load_flag_table("sglang", "0.5.17"))
    index = 0
    while index < len(argv):
        flag = argv[index]
        if flags.table.resolve(flag).takes == "none":
            flags.set(flag, True, "the logged argv")
            index += 1
        else:
            flags.set(flag, argv[index + 1], "the logged argv")
            index += 2
    return budget.launch_from_flags(flags, {}, 1, LOGGED["gpu"]["memory_mib"], LOGGED["weights_bytes"], rules)


def plan_kwargs(case: dict[str, Any], ct129: dict[str, Any], **settings: Any) -> dict[str, Any]:
    """build_plan's arguments for one case as bench/realsize rendered it for h200-realsize-0517, with
    the --mem-fraction-static it was launched at when the case left it to the plan (then 0.5.11's
    default, 0.812; the plan now writes 0.5.17's own, 0.835: see the test below)."""
    group = ct129["group"]
    launched_fraction = {}
    if "--mem-fraction-static" not in case["overrides"] and flag_of(case["argv"], "--mem-fraction-static"):
        launched_fraction = {"--mem-fraction-static": float(flag_of(case["argv"], "--mem-fraction-static"))}
    return {
        "engine": "sglang",
        "engine_version": "0.5.17",
        "venv_dir": "/root/ml-env.d/0123456789ab",
        "model_path": "/root/models/Qwen3.6-27B",
        "host": group["inference_server_host"],
        "port": group["inference_server_port"],
        "gpus": [LOGGED["gpu"]],
        "weights_bytes": LOGGED["weights_bytes"],
        "settings": {**profile_settings(group), **case["settings"], **settings},
        "overrides": {**REALSIZE_OVERRIDES, **launched_fraction, **case["overrides"]},
        "cache_dir": "/var/cache/inference-server",
    }


def flag_of(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


# --------------------------------------------------------------------------------------
# SGLang 0.5.17's own figures on one H200
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STARTED)
def test_budget_reproduces_what_0517_logged_on_one_h200(budget, common, geo, name):
    case = CASES[name]
    result = budget.compute_budget(geo, launch_of(budget, common, case["argv"]))
    assert result.starts and result.outside_fits and result.rules == "0.5.17"
    for key, predicted in (
        ("kv_tokens", result.kv_tokens),
        ("mamba_slots", result.mamba_slots),
        ("max_running", result.max_running),
    ):
        assert close(predicted, case[key]), (key, predicted, case[key])
    # The intermediates are sized for the capped running requests + 1 (SSM part of the verify buffers).
    ssm = result.verify_reserved_gib * result.mamba_ssm_bytes / (result.mamba_ssm_bytes + result.mamba_conv_bytes)
    assert close(ssm, case["intermediate_ssm_gib"]), (ssm, case["intermediate_ssm_gib"])
    if "capped_to" in case:
        assert result.mamba_cap == case["capped_to"] < case["requested_running"]


def test_0511_rules_were_far_off_there(budget, common, geo):
    """Why 0.5.17 has rules of its own: 0.5.11's give twice the mamba slots and 4 running requests, not 1."""
    old = budget.compute_budget(geo, launch_of(budget, common, CASES["plan_default"]["argv"], "0.5.11"))
    assert old.mamba_slots == 197 and CASES["plan_default"]["mamba_slots"] == 98
    capped = budget.compute_budget(geo, launch_of(budget, common, CASES["capped_0.45"]["argv"], "0.5.11"))
    assert capped.max_running == 4 and CASES["capped_0.45"]["max_running"] == 1


def test_the_case_0517_did_not_start_does_not_start(budget, common, geo):
    case = CASES["squeezed_0.41_48"]
    assert "Not enough GPU memory for hybrid (mamba/linear-attention) state cache" in case["outcome"]
    result = budget.compute_budget(geo, launch_of(budget, common, case["argv"]))
    assert not result.starts and result.mamba_slots <= 0
    assert result.mamba_slots == case["mamba_slots"]  # -4: the same arithmetic as SGLang's


def test_memory_before_the_pools_is_the_logged(budget, common, geo):
    """The CUDA context and what loads before the pools (the target, the draft, 0.10 GiB) against the log."""
    logged = LOGGED["logged"]
    result = budget.compute_budget(geo, launch_of(budget, common, CASES["plan_default"]["argv"]))
    assert close(result.available_gib, logged["avail_before_target_load_gib"], 0.001)
    assert close(result.draft_weights_load_gib, logged["draft_weights_gib"], 0.01)
    profiled = logged["squeezed_total_rest_memory_gib"] + (1 - 0.41) * logged["avail_before_target_load_gib"]
    taken = result.weights_gib + result.before_pools_gib
    assert abs(result.available_gib - taken - profiled) < 0.05, (result.available_gib - taken, profiled)
    assert close(result.mamba_per_request_gib * 1024, logged["mamba_cache_per_req_mib"], 0.001)


def test_pools_add_up_to_the_static_memory(budget, common, geo):
    """0.5.17: the weights, the draft, the verify buffers, the slots (+ 1 padding) and the KV cache fill
    the static pools; the mamba share is 0.9/1.9 of what the weights leave."""
    result = budget.compute_budget(geo, launch_of(budget, common, CASES["concurrency_24"]["argv"]))
    per_req = result.mamba_per_request_gib
    used = result.weights_gib + result.before_pools_gib + result.verify_reserved_gib
    used += (result.mamba_slots + 1) * per_req + result.kv_gib
    assert result.static_gib - used == pytest.approx(0, abs=result.kv_bytes_per_token / GIB)
    rest = result.static_gib - result.weights_gib - result.before_pools_gib
    solved = (result.mamba_slots + 1) * per_req + (result.mamba_slots / 5 + 1) * result.draft_tokens * per_req
    assert solved <= rest * 0.9 / 1.9 < solved + (1 + result.draft_tokens / 5) * per_req


def test_unknown_rules_are_refused(budget, geo):
    launch = budget.Launch(gpu_memory_mib=143771, tp=1, weights_bytes=LOGGED["weights_bytes"], rules="0.4.0")
    with pytest.raises(budget.PlanError, match="budget_rules '0.4.0' is not a set of memory-budget rules"):
        budget.compute_budget(geo, launch)


# --------------------------------------------------------------------------------------
# The engine versions' facts name the rules
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "rules"),
    [("0.5.11", "0.5.11"), ("0.5.12", "0.5.11"), ("0.5.17", "0.5.17"), ("0.5.19", "0.5.17"), ("0.5.23", "0.5.11")],
)
def test_each_version_has_its_budget_rules(launch_plan, version, rules):
    engines = importlib.import_module("deploytools.launch_plan.engines")
    assert engines.engine_version("sglang", version).budget_rules == rules


# --------------------------------------------------------------------------------------
# The plan for each case, as bench/realsize renders it for h200-realsize-0517
# --------------------------------------------------------------------------------------


def test_plan_default_predicts_what_0517_logged(launch_plan, qwen_config, ct129):
    case = CASES["plan_default"]
    plan = launch_plan.build_plan(qwen_config, **plan_kwargs(case, ct129))
    for flag in ("--mem-fraction-static", "--max-running-requests", "--context-length", "--tp-size"):
        ours, launched = flag_of(plan["argv"], flag), flag_of(case["argv"], flag)
        assert ours == launched or float(ours or "nan") == float(launched or "nan"), flag
    result = plan["budget"]
    for key in ("kv_tokens", "mamba_slots", "max_running"):
        assert close(result[key], case[key]), (key, result[key], case[key])
    assert result["rules"] == "0.5.17"
    header = 'memory budget per GPU by SGLang 0.5.17\'s rules (docs/launch-plan.md, "Memory budget"), one row per term:'
    assert header in plan["notes"]
    assert not any(note.startswith("WARNING:") for note in plan["notes"])


@pytest.mark.parametrize("name", ["capped_0.45", "refused_0.45_48", "concurrency_24"])
def test_a_cap_below_the_target_is_refused(launch_plan, qwen_config, ct129, name):
    """0.5.17 started these with fewer running requests than the target: the plan refuses them with
    the figures SGLang logged."""
    case = CASES[name]
    kwargs = plan_kwargs(case, ct129)
    target = kwargs["settings"]["target_concurrency"]
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **kwargs)
    message = str(err.value)
    assert message.startswith(f"inference_server_target_concurrency is {target}, but the memory budget")
    assert (
        f"holds only {case['max_running']} running requests ({case['mamba_slots']} mamba slots at 5 per request), "
        "to which SGLang 0.5.17 would cap them at start-up instead of refusing to start: "
    ) in message
    assert message.count(". ") == 0, "one sentence"


def test_the_capped_refusal_word_for_word(launch_plan, qwen_config, ct129):
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **plan_kwargs(CASES["capped_0.45"], ct129))
    assert str(err.value) == (
        "inference_server_target_concurrency is 4, but the memory budget per GPU (--mem-fraction-static "
        "0.45 (inference_server_overrides['--mem-fraction-static']), --max-running-requests 8 "
        "(inference_server_overrides['--max-running-requests'])) holds only 1 running requests (6 mamba slots at 5 "
        "per request), to which SGLang 0.5.17 would cap them at start-up instead of refusing to start: lower "
        "inference_server_target_concurrency to 1 or raise inference_server_overrides['--mem-fraction-static'] to "
        "at least 0.502."
    )


def test_the_case_0517_did_not_start_is_refused(launch_plan, qwen_config, ct129):
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **plan_kwargs(CASES["squeezed_0.41_48"], ct129))
    assert str(err.value) == (
        "the memory budget per GPU cannot start SGLang 0.5.17: with --mem-fraction-static 0.41 "
        "(inference_server_overrides['--mem-fraction-static']) and --max-running-requests 48 "
        "(inference_server_overrides['--max-running-requests']), the target's weights (51.0 GiB) and the MTP "
        "draft's (5.5 GiB), which SGLang 0.5.17 loads before it sizes its pools, take 56.6 GiB of the 56.4 GiB "
        "static pools and leave no mamba state slot (SGLang stops with 'RuntimeError: Not enough GPU memory for "
        "hybrid (mamba/linear-attention) state cache'): raise inference_server_overrides['--mem-fraction-static'] "
        "to at least 0.502."
    )
    assert str(err.value).count(". ") == 0, "one sentence"


def test_a_cap_the_operator_allows_is_said_loudly(launch_plan, qwen_config, ct129):
    """Without target_concurrency the plan keeps what SGLang 0.5.17 will cap, with a WARNING note."""
    case = CASES["capped_0.45"]
    plan = launch_plan.build_plan(qwen_config, **plan_kwargs(case, ct129, target_concurrency=None))
    result = plan["budget"]
    for key in ("kv_tokens", "mamba_slots", "max_running"):
        assert close(result[key], case[key]), (key, result[key], case[key])
    warnings = [note for note in plan["notes"] if note.startswith("WARNING:")]
    assert warnings == [
        "WARNING: SGLang 0.5.17 will cap --max-running-requests 8 "
        "(inference_server_overrides['--max-running-requests']) to 1 at start-up instead of refusing to start: its "
        "mamba state cache holds 6 slots at 5 per request (it logs "
        "'max_running_requests is capped to 1 by the mamba state cache'); raise "
        "inference_server_overrides['--mem-fraction-static'] or lower --max-running-requests to run what is asked"
    ]
    assert case["capped_message"].startswith("max_running_requests is capped to 1 by the mamba state cache")


def test_a_cap_at_or_above_the_target_is_kept_with_the_warning(launch_plan, qwen_config, ct129):
    """0.45 with 8 asked caps to 1: a target of 1 is met, so the plan keeps it and says so loudly."""
    plan = launch_plan.build_plan(qwen_config, **plan_kwargs(CASES["capped_0.45"], ct129, target_concurrency=1))
    assert plan["budget"]["max_running"] == 1
    assert any(note.startswith("WARNING: SGLang 0.5.17 will cap --max-running-requests 8") for note in plan["notes"])


# --------------------------------------------------------------------------------------
# bench/results/realsize-0.5.17.json: what the plan predicted beside what 0.5.17 logged
# --------------------------------------------------------------------------------------


def test_the_recorded_predictions_are_within_5_percent():
    """Every case the plan accepted and SGLang started, as bench/realsize collect recorded it."""
    ran = json.loads((REPO / "bench" / "results" / "realsize-0.5.17.json").read_text())["cases"]
    accepted = [row for row in ran if row["launched"] and not row["plan_refused"]]
    assert accepted, "no case the plan accepted was launched"
    for row in accepted:
        for key, value in row["ratios"].items():
            assert value is not None and abs(value - 1) <= TOLERANCE, (row["name"], key, value)
    for row in ran:
        if row["plan_refused"] and row["launched"]:  # refused for the target, though 0.5.17 started it capped
            assert "to which SGLang 0.5.17 would cap them" in row["plan_error"], row["name"]


def test_the_plans_own_fraction_for_0517_is_sglang_0517s_default(launch_plan, qwen_config, ct129):
    """server_args.py _handle_gpu_memory_settings of 0.5.17: no 4 GiB for the draft, the prefill CUDA
    graphs counted for a multimodal model too; on the H200 0.835 (0.5.11's: 0.812), and ct129's four
    running requests fit at its 0.786 (0.5.11's 0.717 would cap them to 2)."""
    kwargs = plan_kwargs(CASES["plan_default"], ct129)
    kwargs["overrides"] = {k: v for k, v in kwargs["overrides"].items() if k != "--mem-fraction-static"}
    plan = launch_plan.build_plan(qwen_config, **kwargs)
    assert flag_of(plan["argv"], "--mem-fraction-static") == "0.835"
    assert plan["budget"]["max_running"] == 4
