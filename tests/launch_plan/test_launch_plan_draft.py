"""The drafter part of the launch plan (tools/deploytools/launch_plan/draft.py): DFLASH on ct129.

The drafter config is files/models/dflash-drafter-27b.config.json, one SGLang 0.5.11 accepted
and served beside Qwen3.6-27B's real config on one H200 (bench/realsize, docs/launch-plan.md).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from deploytools import make_tiny_model, reliability_report
from launch_plan_cases import REPO

DRAFTER_CONFIG = REPO / "files" / "models" / "dflash-drafter-27b.config.json"
DRAFT_DIR = "/root/models/Qwen3.6-27B-DFlash/revisions/r1"


@pytest.fixture()
def drafter() -> dict[str, Any]:
    """The DFlash drafter's config.json for Qwen3.6-27B."""
    return json.loads(DRAFTER_CONFIG.read_text())


@pytest.fixture()
def dflash_kwargs(ct129_kwargs: dict[str, Any], drafter: dict[str, Any]) -> dict[str, Any]:
    """ct129 with DFLASH instead of NEXTN, and the drafter synced."""
    settings = {k: v for k, v in ct129_kwargs["settings"].items() if not k.startswith("speculative_")}
    return dict(
        ct129_kwargs,
        settings=dict(settings, speculative_algorithm="DFLASH"),
        draft_config=drafter,
        draft_path=DRAFT_DIR,
    )


def argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_dflash_plan_pins_the_drafter_and_its_block_size(launch_plan, qwen_config, dflash_kwargs):
    plan = launch_plan.build_plan(qwen_config, **dflash_kwargs)
    argv = plan["argv"]
    assert argv_value(argv, "--speculative-algorithm") == "DFLASH"
    assert argv_value(argv, "--speculative-draft-model-path") == DRAFT_DIR
    assert argv_value(argv, "--speculative-num-draft-tokens") == "16"
    # Hybrid target + speculative + radix cache: extra_buffer, as for NEXTN.
    assert argv_value(argv, "--mamba-scheduler-strategy") == "extra_buffer"
    assert plan["env"]["SGLANG_ENABLE_SPEC_V2"] == "1"
    assert "--speculative-num-steps" not in argv and "--disable-overlap-schedule" not in argv
    assert any(
        n.startswith(f"DFLASH with the drafter {DRAFT_DIR}: block size 16") and "overlap scheduler" in n
        for n in plan["notes"]
    )


def test_dflash_with_disabled_radix_cache_keeps_no_buffer(launch_plan, qwen_config, dflash_kwargs):
    kwargs = dict(dflash_kwargs, settings=dict(dflash_kwargs["settings"], disable_radix_cache=True))
    argv = launch_plan.build_plan(qwen_config, **kwargs)["argv"]
    assert "--disable-radix-cache" in argv and "--mamba-scheduler-strategy" not in argv


def test_matching_draft_tokens_are_kept(launch_plan, qwen_config, dflash_kwargs):
    kwargs = dict(dflash_kwargs, overrides={"--speculative-dflash-block-size": 16})
    argv = launch_plan.build_plan(qwen_config, **kwargs)["argv"]
    assert argv_value(argv, "--speculative-num-draft-tokens") == "16"
    assert argv_value(argv, "--speculative-dflash-block-size") == "16"


def test_eagle_gets_the_drafter_without_dflash_rules(launch_plan, qwen_config, ct129_kwargs):
    settings = dict(ct129_kwargs["settings"], speculative_algorithm="EAGLE3")
    argv = launch_plan.build_plan(
        qwen_config,
        **dict(
            ct129_kwargs,
            settings=settings,
            draft_path=DRAFT_DIR,
            draft_config={"architectures": ["LlamaForCausalLMEagle3"]},
        ),
    )["argv"]
    assert argv_value(argv, "--speculative-draft-model-path") == DRAFT_DIR
    assert argv_value(argv, "--speculative-num-draft-tokens") == "4"


def test_a_synced_drafter_is_not_passed_to_nextn(launch_plan, qwen_config, ct129_kwargs, drafter):
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, draft_config=drafter, draft_path=DRAFT_DIR))
    assert "--speculative-draft-model-path" not in plan["argv"]
    assert any("does not use one" in n for n in plan["notes"])


def test_the_drafter_weights_count_in_the_memory_rule(launch_plan, qwen_config, dflash_kwargs):
    kwargs = dict(dflash_kwargs, draft_weights_bytes=40 * 1024**3)
    with pytest.raises(launch_plan.PlanError, match="the weights need 45.9 GiB per GPU"):
        launch_plan.build_plan(qwen_config, **kwargs)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(config: dict[str, Any]) -> dict[str, Any]:
        config = copy.deepcopy(config)
        node = config
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
        return config

    return change


# name: (change to the drafter config, change to the kwargs, message)
DRAFT_REFUSALS: dict[str, tuple[Any, dict[str, Any], str]] = {
    "no-drafter": (
        None,
        {"draft_path": None, "draft_config": None},
        "inference_server_speculative_algorithm is DFLASH, which drafts with a separate model, but no "
        "drafter is synced: set model_sync_draft_source and model_sync_draft_name to the drafter, or choose NEXTN "
        "(the model's own MTP head) or null.",
    ),
    "override-of-the-drafter-path": (
        None,
        {"overrides": {"--speculative-draft-model-path": "/tmp/other"}},
        "inference_server_overrides['--speculative-draft-model-path'] would replace --speculative-draft-model-path, "
        "which the plan takes from model_sync_draft_model_dir (the synced drafter, model_sync_draft_source): set "
        "that variable instead.",
    ),
    "not-a-dflash-drafter": (
        _set("architectures", ["Qwen3ForCausalLM"]),
        {},
        "inference_server_speculative_algorithm is DFLASH, but the drafter of model_sync_draft_source has "
        "the architecture Qwen3ForCausalLM, not DFlashDraftModel: point model_sync_draft_source at a DFlash "
        "drafter, or choose the algorithm the drafter was trained for (EAGLE, EAGLE3).",
    ),
    "hidden-size-differs": (
        _set("hidden_size", 4096),
        {},
        "the DFlash drafter of model_sync_draft_source has hidden_size 4096, but the target's is 5120: a DFlash "
        "drafter reads the target's hidden states, so point model_sync_draft_source at the drafter trained for "
        "this target.",
    ),
    "draft-tokens-differ-from-block-size": (
        None,
        {"settings_change": {"speculative_num_draft_tokens": 8}},
        "inference_server_speculative_num_draft_tokens sets --speculative-num-draft-tokens to 8, but the "
        "DFlash drafter verifies blocks of 16 tokens (block_size in its config.json): remove it or set it to 16.",
    ),
    "block-size-override-differs": (
        None,
        {"overrides": {"--speculative-dflash-block-size": 8}},
        "inference_server_overrides['--speculative-dflash-block-size'] sets --speculative-dflash-block-size to 8, "
        "but the DFlash drafter verifies blocks of 16 tokens (block_size in its config.json): remove it or set it "
        "to 16.",
    ),
    "steps-other-than-one": (
        None,
        {"settings_change": {"speculative_num_steps": 3}},
        "inference_server_speculative_num_steps sets --speculative-num-steps to 3, but DFLASH drafts a "
        "whole block in one step with top-k 1 and SGLang 0.5.11 would silently change it to 1: remove it or set it "
        "to 1.",
    ),
    "target-layer-beyond-the-target": (
        _set("dflash_config.target_layer_ids", [1, 16, 31, 46, 63]),
        {},
        "the DFlash drafter of model_sync_draft_source reads target_layer_ids [1, 16, 31, 46, 63], but the target "
        "has 64 layers and SGLang captures the output of layer id + 1, so every id must lie between 0 and 62: "
        "point model_sync_draft_source at the drafter trained for this target.",
    ),
    "mask-token-outside-the-vocabulary": (
        _set("dflash_config.mask_token_id", 248320),
        {},
        "the DFlash drafter of model_sync_draft_source has mask_token_id 248320, but it must be a token of the "
        "target's vocabulary (0 to 248319), or SGLang 0.5.11 stops when the drafter loads: point "
        "model_sync_draft_source at the drafter trained for this target.",
    ),
    "heads-not-divisible-by-tp": (
        _set("num_attention_heads", 15),
        {},
        "inference_server_tensor_parallel_size is 2, which does not divide the DFlash drafter's 15 "
        "attention heads (num_attention_heads): set the tensor-parallel size to one that divides both the target's "
        "and the drafter's heads.",
    ),
    "dp-attention": (
        None,
        {"overrides": {"--enable-dp-attention": True}},
        "inference_server_overrides['--enable-dp-attention'] enables DP attention, which SGLang 0.5.11 refuses with "
        "DFLASH speculative decoding: remove it, or set inference_server_speculative_algorithm to another "
        "algorithm.",
    ),
    "pipeline-parallel": (
        None,
        {"overrides": {"--pp-size": 2}},
        "inference_server_overrides['--pp-size'] is 2, but SGLang 0.5.11 runs DFLASH speculative decoding only "
        "with pipeline size 1: remove it or set it to 1.",
    ),
    "bad-block-size": (
        _set("dflash_config.block_size", 0),
        {},
        "the DFlash drafter of model_sync_draft_source has block_size 0, which is not a positive integer: point "
        "model_sync_draft_source at a complete DFlash drafter.",
    ),
    "hybrid-extra-buffer-without-radix-cache": (
        None,
        {"overrides": {"--disable-radix-cache": True}},
        "inference_server_overrides['--disable-radix-cache'] disables the radix cache, which SGLang refuses "
        "together with --mamba-scheduler-strategy extra_buffer, set by the plan (derived from "
        "inference_server_speculative_algorithm): set inference_server_disable_radix_cache to true instead, so "
        "the plan keeps no_buffer.",
    ),
}


@pytest.mark.parametrize("name", sorted(DRAFT_REFUSALS))
def test_bad_drafter_is_refused_with_its_message(launch_plan, qwen_config, dflash_kwargs, drafter, name):
    change, kwargs_change, message = DRAFT_REFUSALS[name]
    kwargs = dict(dflash_kwargs, draft_config=change(drafter) if change else drafter)
    for key, value in kwargs_change.items():
        if key == "settings_change":
            kwargs["settings"] = dict(kwargs["settings"], **value)
        else:
            kwargs[key] = value
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(qwen_config, **kwargs)
    assert str(err.value) == message
    assert str(err.value).count(". ") == 0, "one sentence"


def test_the_reliability_page_quotes_the_plans_own_sentences(launch_plan, qwen_config, dflash_kwargs, drafter):
    """docs/reliability.md's hand-written drafter rows (tools/reliability-report) are the plan's refusals."""
    refusals = {message for _, _, message in DRAFT_REFUSALS.values()}
    for row in reliability_report.DRAFTER_ROWS:
        assert row["message"] in refusals, row["case"]
    page = (REPO / "docs" / "reliability.md").read_text()
    assert page.count("model_sync_draft_source") >= len(reliability_report.DRAFTER_ROWS)


def test_the_memory_budget_takes_dflash_verify_intermediates_per_block(launch_plan, qwen_config, drafter):
    """One H200, the real target, DFLASH with 4 running requests: SGLang logged 'intermediates 11.25 GB for
    4 requests x 16 tokens' (docs/launch-plan.md). The budget reads the drafter's block size
    from the --speculative-num-draft-tokens the drafter rules set."""
    gib = 1024**3
    kwargs = {
        "engine": "sglang",
        "engine_version": "0.5.11",
        "venv_dir": "/v",
        "model_path": "/m",
        "host": "127.0.0.1",
        "port": 30000,
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_mib": 143771}],
        "weights_bytes": 55566139392,
        "settings": {
            "tensor_parallel_size": 1,
            "dtype": "bfloat16",
            "trust_remote_code": True,
            "speculative_algorithm": "DFLASH",
        },
        "overrides": {
            "--max-running-requests": 4,
            "--attention-backend": "flashinfer",
            "--cuda-graph-max-bs": 32,
            "--chunked-prefill-size": 4096,
        },
        "draft_config": drafter,
        "draft_path": DRAFT_DIR,
    }
    plan = launch_plan.build_plan(qwen_config, **kwargs)
    memory = plan["budget"]
    assert memory["draft_tokens"] == 16 and memory["max_running"] == 4
    intermediate_ssm = memory["mamba_ssm_bytes"] * (memory["max_running"] + 1) * memory["draft_tokens"] / gib
    assert abs(intermediate_ssm - 11.25) <= 0.05 * 11.25, intermediate_ssm
    # Four times NEXTN's 4 draft tokens per request: the same budget holds far fewer requests.
    assert memory["verify_reserved_gib"] == pytest.approx(4 * 16 * memory["mamba_ssm_bytes"] / gib, rel=0.05)


def test_the_tiny_dflash_drafter_fits_the_rehearsal_model(launch_plan, tiny_config):
    """tools/make-tiny-model --dflash-drafter: a drafter the DFLASH rules accept for the tiny target."""
    ids = {"<|im_end|>": 2, "<|endoftext|>": 0}
    drafter = make_tiny_model.drafter_config(ids)
    assert drafter["architectures"] == ["DFlashDraftModel"]
    assert drafter["hidden_size"] == make_tiny_model.text_config(ids)["hidden_size"] == tiny_config["hidden_size"]
    plan = launch_plan.build_plan(
        tiny_config,
        engine="sglang",
        engine_version="0.5.11",
        venv_dir="/v",
        model_path="/m",
        host="127.0.0.1",
        port=30000,
        gpus=[{"index": 0, "name": "GPU", "memory_mib": 81559}],
        settings={"speculative_algorithm": "DFLASH"},
        draft_config=drafter,
        draft_path="/srv/models/tiny-dflash/current",
    )
    assert argv_value(plan["argv"], "--speculative-num-draft-tokens") == "16"
    assert make_tiny_model.text_config(ids, 32)["layer_types"].count("full_attention") == 8
