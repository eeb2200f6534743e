"""The launch plan of every SGLang version with a check venv, run through that version's own
parser and validation on this CPU-only machine (``sglang_venv``: 0.5.11 and 0.5.17 in make test,
0.5.23 in make sglang-check-newest).

Each version stops at its first GPU-only check, the mamba extra_buffer's platform assertion, and
each names it differently; with the radix cache off (no_buffer) nothing GPU-only is reached and
the whole validation runs, resolving derived values the way the server does at start-up
(``ServerArgs.__post_init__`` up to 0.5.17, ``ServerArgs.resolve_once()`` from 0.5.19 on).
"""

from __future__ import annotations

import json
from typing import Any

from launch_plan_cases import FLAG_TABLES, QWEN_CONFIG

# Where each version stops on this machine with extra_buffer, the step that runs the checks, and
# whether the rehearsal model's architecture (Qwen3_5ForCausalLM) reaches that check too.
GPU_STOP = {
    "0.5.11": {
        "where": "sglang/srt/server_args.py:2403 in _handle_mamba_radix_cache",
        "error": "Mamba extra_buffer is only supported on CUDA and MUSA devices with FLA backend",
        "stage": "prepare_server_args",
        "tiny_model_stops": False,
    },
    "0.5.17": {
        "where": "sglang/srt/server_args.py:5590 in _validate_mamba_extra_buffer",
        "error": "extra_buffer needs CUDA/MUSA/NPU/ROCm (FLA).",
        "stage": "prepare_server_args",
        "tiny_model_stops": False,
    },
    "0.5.23": {
        "where": "sglang/srt/arg_groups/mamba_hook.py:120 in validate_mamba_extra_buffer",
        "error": "extra_buffer requires platform support for Mamba cache state snapshots.",
        "stage": "resolve_once",
        "tiny_model_stops": True,
    },
}


def flag_table(version: str) -> dict[str, Any]:
    """The committed flag table of an SGLang version."""
    return json.loads((FLAG_TABLES / f"sglang-{version}.json").read_text())


def radix_strategy(resolved: dict[str, Any]) -> str | None:
    """The resolved mamba radix-cache strategy (renamed from mamba_scheduler_strategy in 0.5.17)."""
    return resolved.get("mamba_radix_cache_strategy") or resolved.get("mamba_scheduler_strategy")


def assert_written_for(version: str, plan: dict[str, Any]) -> None:
    """The plan was checked against ``version``'s own table, and writes every flag by its current name."""
    assert not [n for n in plan["notes"] if "no flag table for sglang" in n], plan["notes"]
    flags = flag_table(version)["flags"]
    names = {alias: name for name, spec in flags.items() for alias in (name, *spec["aliases"])}
    written = [a.split("=", 1)[0] for a in plan["argv"] if a.startswith("--")]
    assert [f for f in written if f not in names] == [], f"flags SGLang {version} does not have"
    assert [f for f in written if flags[names[f]]["deprecated"]] == [], f"flags SGLang {version} deprecates"


def test_every_locked_version_has_an_expected_gpu_stop(sglang_venv):
    """A new check venv needs its row in GPU_STOP: what its validation stops at on this machine."""
    assert sglang_venv.version in GPU_STOP, f"add SGLang {sglang_venv.version}'s GPU-only stop to GPU_STOP"


def assert_gpu_stop(version: str, rc: int, result: dict[str, Any]) -> None:
    """The check passed everything up to ``version``'s GPU-only extra_buffer check (GPU_STOP)."""
    assert rc == 3, result
    assert result["engine_version"] == version
    assert result["status"] == "passed-gpu-less"
    assert result["exception"] == "AssertionError"
    expected = GPU_STOP[version]
    assert (result["where"], result["error"], result["stage"]) == (
        expected["where"],
        expected["error"],
        expected["stage"],
    )
    assert result["not_run"][0] == f"the rest of {expected['where'].rsplit(' in ', 1)[1]}"


def test_real_model_plan_passes_the_versions_own_checks_up_to_the_gpu_stop(sglang_venv, run_check, plan_for):
    """Qwen3.6-27B's real config.json and ct129's plan: every check before the GPU-only one runs."""
    version, venv = sglang_venv.version, sglang_venv.path
    plan = plan_for(venv, json.loads(QWEN_CONFIG.read_text()))
    assert_written_for(version, plan)
    rc, result = run_check(venv, "sglang", plan["argv"], env=plan["env"])
    assert_gpu_stop(version, rc, result)


def test_tiny_model_plan_passes_the_versions_own_checks(sglang_venv, run_check, plan_for, tiny_config):
    """The rehearsal model (flat config, Qwen3_5ForCausalLM) with ct129's settings. Up to 0.5.17
    SGLang's model-specific mamba handling, where the GPU-only extra_buffer check sits, lists
    Qwen3_5ForConditionalGeneration and not this architecture, so every check runs; 0.5.23's
    resolution reaches that check for it too."""
    version, venv = sglang_venv.version, sglang_venv.path
    plan = plan_for(venv, tiny_config, weights_bytes=None)  # no weights size: no memory budget
    assert_written_for(version, plan)
    rc, result = run_check(venv, "sglang", plan["argv"], env=plan["env"])
    if GPU_STOP[version]["tiny_model_stops"]:
        assert_gpu_stop(version, rc, result)
        return
    assert rc == 0, result
    assert result["status"] == "passed" and result["engine_version"] == version
    resolved = result["resolved"]
    assert radix_strategy(resolved) == "extra_buffer"
    assert resolved["speculative_algorithm"] == "EAGLE", "NEXTN resolves to EAGLE"
    assert resolved["max_running_requests"] == 48, "SGLang's default for speculative decoding"


def test_whole_validation_resolves_what_the_server_would(sglang_venv, run_check, plan_for, ct129_kwargs):
    """No radix cache, no extra_buffer: every check runs, and SGLang derives what the argv leaves open."""
    version, venv = sglang_venv.version, sglang_venv.path
    plan = plan_for(venv, settings=dict(ct129_kwargs["settings"], disable_radix_cache=True))
    argv = list(plan["argv"])
    i = argv.index("--max-running-requests")
    del argv[i : i + 2]  # SGLang derives it for speculative decoding
    rc, result = run_check(venv, "sglang", argv, env=plan["env"])
    assert rc == 0, result
    assert result["status"] == "passed" and result["engine_version"] == version
    resolved = result["resolved"]
    assert resolved["max_running_requests"] == 48, "SGLang's default for speculative decoding"
    assert resolved["speculative_algorithm"] == "EAGLE", "NEXTN resolves to EAGLE"
    assert (resolved["speculative_num_steps"], resolved["speculative_eagle_topk"]) == (3, 1)
    assert resolved["speculative_num_draft_tokens"] == 4
    assert resolved["disable_radix_cache"] is True and radix_strategy(resolved) != "extra_buffer"
    assert resolved["tp_size"] == 2 and resolved["device"] == "cuda"
    assert resolved["mem_fraction_static"] == float(argv[argv.index("--mem-fraction-static") + 1])
