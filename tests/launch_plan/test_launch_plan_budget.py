"""The memory budget (tools/deploytools/launch_plan/budget.py) against SGLang 0.5.11's own figures.

SGLang logged its pools for Qwen3.6-27B at real size on one H200
(tests/launch_plan/fixtures/sglang_realsize_h200_logged.json, from a bench/realsize run);
the budget must reproduce each figure within 5 %, refuse the launches SGLang refused, and set
the flags of ct129's plan from the same rules.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
from types import ModuleType
from typing import Any

import pytest
from deploytools.launch_plan.common import setting_variable
from launch_plan_cases import REPO

LOGGED = json.loads((REPO / "tests" / "launch_plan" / "fixtures" / "sglang_realsize_h200_logged.json").read_text())
GIB = 1024**3
TOLERANCE = 0.05
# nvidia-smi's memory.total of the GPU sizes the matrix covers.
GPU_MIB = {24: 24564, 48: 49140, 80: 81559, 141: 143771}


@pytest.fixture(scope="module")
def budget(launch_plan: ModuleType) -> ModuleType:
    """deploytools.launch_plan.budget (its PlanError is deploytools.launch_plan.errors')."""
    return importlib.import_module("deploytools.launch_plan.budget")


@pytest.fixture(scope="module")
def geo(budget: ModuleType, qwen_config: dict[str, Any]) -> Any:
    return budget.geometry(qwen_config)


def h200_launch(budget: ModuleType, run: dict[str, Any]) -> Any:
    """The Launch of one logged run: the probe's flags, the run's fraction and running requests."""
    flags = LOGGED["launch"]
    return budget.Launch(
        gpu_memory_mib=LOGGED["gpu"]["memory_mib"],
        tp=flags["tensor_parallel_size"],
        weights_bytes=LOGGED["weights_bytes"],
        mem_fraction_static=run["mem_fraction_static"],
        max_running_requests=run["max_running_requests"],
        speculative_algorithm=flags["speculative_algorithm"],
        draft_tokens=flags["speculative_num_draft_tokens"],
        extra_buffer=True,
        chunked_prefill_size=flags["overrides"]["--chunked-prefill-size"],
        cuda_graph_max_bs=flags["overrides"]["--cuda-graph-max-bs"],
    )


def close(predicted: float, logged: float, tolerance: float = TOLERANCE) -> bool:
    return abs(predicted - logged) <= tolerance * abs(logged)


# --------------------------------------------------------------------------------------
# SGLang's own figures on one H200
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index",
    range(len(LOGGED["runs"])),
    ids=[
        f"mfs{r['mem_fraction_static'] or 'default'}-running{r['max_running_requests'] or 48}" for r in LOGGED["runs"]
    ],
)
def test_budget_reproduces_what_sglang_logged_on_one_h200(budget, geo, index):
    run = LOGGED["runs"][index]
    result = budget.compute_budget(geo, h200_launch(budget, run))
    if run["outcome"] != "started":
        assert not result.starts and result.kv_tokens <= 0, result
        return
    assert result.starts and result.outside_fits
    if "logged_mem_fraction_static" in run:
        assert round(result.mem_fraction_static, 3) == run["logged_mem_fraction_static"]
    assert close(result.mamba_slots, run["mamba_slots"]), (result.mamba_slots, run["mamba_slots"])
    assert close(result.kv_tokens, run["kv_tokens"]), (result.kv_tokens, run["kv_tokens"])
    assert result.max_running == run["max_running"]
    ssm = result.mamba_ssm_bytes * (result.max_running + 1) * result.draft_tokens / GIB
    assert close(ssm, run["intermediate_ssm_gib"]), (ssm, run["intermediate_ssm_gib"])


def test_pool_and_weight_sizes_are_the_logged_ones(budget, geo):
    """Per-slot, per-token and weight terms against the default run's log lines (GB = GiB there)."""
    logged, run = LOGGED["logged"], LOGGED["runs"][0]
    conv, ssm = budget.mamba_state_bytes(geo, 1)
    slots = run["mamba_slots"] + 1  # MambaPool allocates size + 1 (slot 0 is padding)
    assert round(conv * slots / GIB, 2) == logged["conv_state_gib"]
    assert round(ssm * slots / GIB, 2) == logged["ssm_state_gib"]
    assert round(conv * (run["max_running"] + 1) * 4 / GIB, 2) == logged["intermediate_conv_window_gib"]
    cell = budget.kv_bytes_per_token(geo, 1, 2)
    assert cell == 64 * 1024
    assert round(run["kv_tokens"] * cell / 2 / GIB, 2) == logged["kv_k_gib"]
    draft_cell = budget.kv_bytes_per_token(geo, 1, 2, geo.mtp_layers)
    assert round(run["kv_tokens"] * draft_cell / 2 / GIB, 2) == logged["draft_kv_k_gib"]
    result = budget.compute_budget(geo, h200_launch(budget, run))
    assert close(result.weights_gib, logged["target_weights_gib"], 0.01)
    assert close(result.draft_weights_load_gib, logged["draft_weights_gib"], 0.01)


def test_sglang_gb_are_gib(budget, geo):
    """SGLang's "GB" (mem_cache/memory_pool.py: GB = 1024**3) are GiB: bytes / 1e9 does not give the log."""
    conv, _ = budget.mamba_state_bytes(geo, 1)
    nbytes = conv * (LOGGED["runs"][0]["mamba_slots"] + 1)
    assert round(nbytes / 2**30, 2) == LOGGED["logged"]["conv_state_gib"]
    assert round(nbytes / 1e9, 2) != LOGGED["logged"]["conv_state_gib"]


def test_cuda_context_constant_is_the_logged_overhead(budget):
    total = LOGGED["gpu"]["memory_mib"] / 1024
    before_load = LOGGED["logged"]["avail_after_target_load_gib"] + LOGGED["logged"]["target_weights_gib"]
    assert abs(budget.CUDA_CONTEXT_GIB - (total - before_load)) < 0.01


# --------------------------------------------------------------------------------------
# The rules, term by term
# --------------------------------------------------------------------------------------


def test_default_fraction_follows_sglangs_tiers(budget, geo):
    # 48 GB, TP 2: reserved 512 + 4096 x 1.5 + 32 x 2 + 256 + 4096 (EAGLE) MiB, then the ViT factor.
    expected = round((49140 - 11072) / 49140, 3) * budget.vlm_factor(geo.vision)
    assert budget.default_mem_fraction(49140, 2, geo, "NEXTN", 4096, 32, False) == pytest.approx(expected)
    assert budget.memory_tier(49140, 2) == (4096, 32)
    assert budget.memory_tier(143771, 1) == (8192, 256)
    # Over 60 GiB the reserve is at least 10 GiB before the draft's 4 GiB.
    assert budget.default_mem_fraction(143771, 1, geo, None, 4096, 32, False) == pytest.approx(
        round((143771 - 10240) / 143771, 3) * budget.vlm_factor(geo.vision)
    )
    text_only = dataclasses.replace(geo, vision=None)
    assert budget.default_mem_fraction(49140, 2, text_only, "NEXTN", 4096, 32, False) == round(
        (49140 - 11072) / 49140, 3
    )


def test_state_and_kv_per_gpu_halve_at_tp2(budget, geo):
    conv1, ssm1 = budget.mamba_state_bytes(geo, 1)
    conv2, ssm2 = budget.mamba_state_bytes(geo, 2)
    assert ssm1 == 48 * 48 * 128 * 128 * 4  # linear layers x value heads x 128 x 128 x fp32
    assert (conv2, ssm2) == (conv1 // 2, ssm1 // 2)
    assert budget.kv_bytes_per_token(geo, 2, 2) == 32 * 1024


def test_pools_add_up_to_the_static_memory(budget, geo):
    launch = budget.Launch(
        gpu_memory_mib=49140,
        tp=2,
        weights_bytes=LOGGED["weights_bytes"],
        max_running_requests=4,
        speculative_algorithm="NEXTN",
        draft_tokens=4,
        extra_buffer=True,
    )
    result = budget.compute_budget(geo, launch)
    used = result.weights_gib + result.verify_reserved_gib + result.mamba_gib + result.kv_gib
    assert result.static_gib - used == pytest.approx(0, abs=result.kv_bytes_per_token / GIB)
    assert result.mamba_gib / (result.kv_gib + result.mamba_gib) == pytest.approx(0.9 / 1.9, abs=0.01)
    assert result.max_running <= result.mamba_slots // result.slots_per_request


@pytest.mark.parametrize("size", sorted(GPU_MIB))
@pytest.mark.parametrize("tp", [1, 2])
def test_ct129_settings_on_every_gpu_size(launch_plan, qwen_config, ct129_kwargs, size, tp):
    """The sglang_servers settings (4 running requests, at least 32k context) at TP 1 and 2."""
    gpus = [{"index": i, "name": f"{size} GB GPU", "memory_mib": GPU_MIB[size]} for i in range(2)]
    kwargs = dict(ct129_kwargs, gpus=gpus, settings=dict(ct129_kwargs["settings"], tensor_parallel_size=tp))
    weights_per_gpu = LOGGED["weights_bytes"] / tp / GIB
    if weights_per_gpu + 8 > GPU_MIB[size] / 1024:  # the quick fit rule refuses first
        with pytest.raises(launch_plan.PlanError, match="headroom"):
            launch_plan.build_plan(qwen_config, **kwargs)
        return
    if (size, tp) == (80, 1):  # fits, but the budget holds fewer than 4 running requests
        with pytest.raises(launch_plan.PlanError) as err:
            launch_plan.build_plan(qwen_config, **kwargs)
        assert str(err.value).startswith("inference_server_target_concurrency is 4, but the memory budget")
        return
    plan = launch_plan.build_plan(qwen_config, **kwargs)
    result = plan["budget"]
    argv = plan["argv"]
    assert result["max_running"] == 4 and argv[argv.index("--max-running-requests") + 1] == "4"
    assert argv[argv.index("--mem-fraction-static") + 1] == f"{result['mem_fraction_static']:.3f}".rstrip("0")
    assert result["kv_tokens"] >= 32768 and result["outside_fits"]
    context = result["context_length"]
    assert context == min(262144, result["kv_tokens"] // 1024 * 1024)
    assert ("--context-length" in argv) == (context < 262144)


def test_more_memory_gives_more_kv_tokens(budget, geo):
    def tokens(mib: int, tp: int) -> int:
        # fmt: off
        launch = budget.Launch(gpu_memory_mib=mib, tp=tp, weights_bytes=LOGGED["weights_bytes"],
                               mem_fraction_static=0.85, max_running_requests=4, speculative_algorithm="NEXTN",
                               draft_tokens=4, extra_buffer=True)
        # fmt: on
        return budget.compute_budget(geo, launch).kv_tokens

    assert tokens(49140, 2) < tokens(81559, 2) < tokens(143771, 2)
    assert tokens(81559, 1) < tokens(143771, 1)


# --------------------------------------------------------------------------------------
# The plan: flags set, refusals
# --------------------------------------------------------------------------------------


def test_ct129_plan_sets_the_budgeted_flags(launch_plan, qwen_config, ct129_kwargs):
    plan = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    result = plan["budget"]
    assert (result["mem_fraction_static"], result["max_running"], result["mamba_slots"]) == (0.717, 4, 44)
    assert 110_000 < result["kv_tokens"] < 125_000
    rows = [n for n in plan["notes"] if n.startswith("budget | ")]
    assert len(rows) == 10 and any("KV cache" in r and f"{result['kv_tokens']} tokens" in r for r in rows)


def test_sglangs_unset_48_on_ct129_is_refused(launch_plan, qwen_config, ct129_kwargs):
    kwargs = dict(ct129_kwargs, overrides={"--max-running-requests": 48})
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **kwargs)
    assert str(err.value) == (
        "the memory budget per GPU cannot start SGLang: with --mem-fraction-static 0.717 (the plan: SGLang's own "
        "default for this GPU) and --max-running-requests 48 (inference_server_overrides['--max-running-requests']), "
        "the weights (25.5 GiB) leave 7.9 GiB of the 33.5 GiB static pools, and the speculative verify buffers for 48 "
        "requests (13.8 GiB) leave no room for the KV cache (SGLang stops with 'RuntimeError: Not enough memory'): "
        "lower inference_server_overrides['--max-running-requests'] to 7 or raise "
        "inference_server_mem_fraction_static to at least 0.907."
    )


BUDGET_REFUSALS = {
    "target-beyond-the-budget": (
        {"settings": {"target_concurrency": 8}},
        "inference_server_target_concurrency is 8, but the memory budget per GPU (--mem-fraction-static "
        "0.717 (the plan: SGLang's own default for this GPU), --max-running-requests 8 (the plan: "
        "inference_server_target_concurrency)) holds only 7 running requests (37 mamba slots at 5 per "
        "request): lower inference_server_target_concurrency to 7 or raise inference_server_mem_fraction_static "
        "to at least 0.726.",
    ),
    "fraction-leaves-no-room-for-the-draft": (
        {"settings": {"mem_fraction_static": 0.95}},
        "--mem-fraction-static 0.95 (inference_server_mem_fraction_static) leaves 2.0 GiB per GPU beside "
        "SGLang's pools, but the MTP draft (2.8 GiB while it loads), its KV cache (0.6 GiB) and SGLang's activation "
        "and CUDA-graph estimate (6.8 GiB) need 10.2 GiB: lower inference_server_mem_fraction_static to at most "
        "0.78.",
    ),
    "context-beyond-the-kv-cache": (
        {"overrides": {"--context-length": 200000}},
        "inference_server_overrides['--context-length'] is 200000, but the memory budget's KV cache holds 119495 "
        "tokens per GPU, so SGLang would cut every request at 119494: lower it to at most 118784 or leave it unset "
        "so the plan sets it.",
    ),
    "kv-cache-below-the-least-context": (
        {"settings": {"min_context_length": 131072}},
        "the memory budget per GPU (--mem-fraction-static 0.717 (the plan: SGLang's own default for this GPU), "
        "--max-running-requests 4 (the plan: inference_server_target_concurrency)) leaves a KV cache of "
        "119495 tokens, less than inference_server_min_context_length 131072: lower "
        "inference_server_target_concurrency to 1 or raise inference_server_mem_fraction_static to at least 0.733 "
        "or lower inference_server_min_context_length.",
    ),
    "context-below-the-least-context": (
        {"settings": {"context_length": 16384}},
        "inference_server_context_length is 16384, less than inference_server_min_context_length "
        "32768: raise it or lower inference_server_min_context_length.",
    ),
}


@pytest.mark.parametrize("name", sorted(BUDGET_REFUSALS))
def test_budget_refusals(launch_plan, qwen_config, ct129_kwargs, name):
    changes, message = BUDGET_REFUSALS[name]
    kwargs = dict(
        ct129_kwargs,
        settings={**ct129_kwargs["settings"], **changes.get("settings", {})},
        overrides=changes.get("overrides", {}),
    )
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **kwargs)
    assert str(err.value) == message
    assert str(err.value).count(". ") == 0, "one sentence"


def test_explicit_values_are_kept_and_checked(launch_plan, qwen_config, ct129_kwargs):
    kwargs = dict(
        ct129_kwargs,
        settings={
            **ct129_kwargs["settings"],
            "mem_fraction_static": 0.75,
            "max_running_requests": 6,
            "context_length": 65536,
        },
    )
    plan = launch_plan.build_plan(qwen_config, **kwargs)
    argv = plan["argv"]
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.75"
    assert argv[argv.index("--max-running-requests") + 1] == "6"
    assert argv[argv.index("--context-length") + 1] == "65536"
    assert plan["budget"]["max_running"] == 6


def test_the_memory_budget_filter(plan_filters, qwen_config):
    filters = plan_filters
    # fmt: off
    result = filters["memory_budget"](qwen_config, gpu_memory_mib=143771, tp=1, weights_bytes=LOGGED["weights_bytes"],
                                      max_running_requests=8, mem_fraction_static=0.5,
                                      speculative_algorithm="NEXTN", draft_tokens=4, extra_buffer=True,
                                      chunked_prefill_size=4096, cuda_graph_max_bs=32)
    assert result["max_running"] == 8 and close(result["kv_tokens"], 121225)
    # fmt: on


# --------------------------------------------------------------------------------------
# tools/launch-plan: the GPU proof's host
# --------------------------------------------------------------------------------------


def realsize(*extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(REPO / "tools" / "launch-plan"), "h200-realsize", "-i", "inventory/gpu-realsize.yml", "--json", *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_tool_prints_the_realsize_budget():
    result = realsize(
        "-e", json.dumps({"h200_realsize_overrides": {"--mem-fraction-static": 0.45, "--max-running-requests": 8}})
    )
    plan = result["plan"]
    argv = plan["argv"]
    for flag, value in (
        ("--tensor-parallel-size", "1"),
        ("--attention-backend", "flashinfer"),
        ("--load-format", "dummy"),
        ("--mem-fraction-static", "0.45"),
        ("--max-running-requests", "8"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert plan["budget"]["max_running"] == 4 and close(plan["budget"]["kv_tokens"], 61225)
    refused = realsize(
        "-e", json.dumps({"h200_realsize_overrides": {"--mem-fraction-static": 0.45, "--max-running-requests": 48}})
    )
    assert "Not enough memory" in refused["error"]


def test_reliability_page_quotes_the_budget_refusals_as_the_plan_words_them():
    """docs/reliability.md's hand-written budget table (tools/reliability-report PLAN_ONLY)."""
    page = (REPO / "docs" / "reliability.md").read_text()
    for name in (
        "target-beyond-the-budget",
        "fraction-leaves-no-room-for-the-draft",
        "context-beyond-the-kv-cache",
        "kv-cache-below-the-least-context",
    ):
        assert f"`{BUDGET_REFUSALS[name][1]}`" in page, name


def test_a_bf16_ssm_state_halves_the_state_and_gives_more_kv(launch_plan, qwen_config, ct129_kwargs):
    """SGLANG_MAMBA_SSM_DTYPE (configs/mamba_utils.py mamba2_state_dtype) overrides the config's fp32."""
    fp32 = launch_plan.build_plan(qwen_config, **ct129_kwargs)["budget"]
    bf16 = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, environment={"SGLANG_MAMBA_SSM_DTYPE": "bfloat16"}))
    assert bf16["budget"]["mamba_ssm_bytes"] * 2 == fp32["mamba_ssm_bytes"]
    assert bf16["budget"]["kv_tokens"] > fp32["kv_tokens"]


# --------------------------------------------------------------------------------------
# The real-size GPU run launched from our own plan (bench/realsize, bench/results/realsize.json)
# --------------------------------------------------------------------------------------

REALSIZE = json.loads((REPO / "bench" / "results" / "realsize.json").read_text())
REALSIZE_CASES = json.loads((REPO / "bench" / "results" / "realsize_cases.json").read_text())["cases"]


MEMORY_FLAGS = (
    "--tensor-parallel-size",
    "--mem-fraction-static",
    "--max-running-requests",
    "--context-length",
    "--speculative-algorithm",
    "--speculative-num-draft-tokens",
    "--mamba-scheduler-strategy",
    "--load-format",
    "--chunked-prefill-size",
    "--cuda-graph-max-bs",
    "--page-size",
)


def flag_of(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in argv (None when absent)."""
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize("case", REALSIZE_CASES, ids=[c["name"] for c in REALSIZE_CASES])
def test_plan_reproduces_what_sglang_logged_when_launched_from_it(case):
    """Each case re-planned now (tools/launch-plan, the role's code path) against SGLang's own
    start-up figures from the GPU run: within 5 %, and a refusal where SGLang refused."""
    # Each setting is a variable of its own: the group's others stay.
    extra = json.dumps(
        {
            **{setting_variable(key): value for key, value in case["settings"].items()},
            "h200_realsize_overrides": case["overrides"],
        }
    )
    env = dict(os.environ, DEPLOY_CACHE_DIR=str(REPO / ".cache"))
    done = subprocess.run(
        [
            str(REPO / "tools" / "launch-plan"),
            "h200-realsize",
            "-i",
            "inventory/gpu-realsize.yml",
            "-e",
            extra,
            "--json",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    ran = next(r for r in REALSIZE["cases"] if r["name"] == case["name"])
    if not ran["launched"]:
        assert done.returncode == 1, done.stdout
        assert "Not enough memory" in json.loads(done.stdout)["error"]
        assert "Not enough memory" in ran["error"]
        return
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)["plan"]
    # The flags that size SGLang's pools are still the ones it was launched with.
    for flag in MEMORY_FLAGS:
        assert flag_of(plan["argv"], flag) == flag_of(ran["argv"], flag), flag
    for key in ("kv_tokens", "mamba_slots", "max_running"):
        assert close(plan["budget"][key], ran["logged"][key]), (key, plan["budget"][key], ran["logged"][key])
