"""The engines' own checks, run for real: SGLang 0.5.11 (check venv) and transformers serve.
The committed flag table of every SGLang version is its own parser's (test_sglang_versions.py
runs the plan through each version's parser and validation).

On this CPU-only machine SGLang's validation runs up to the first GPU-only check. With the
hybrid-model flags that is ``assert is_cuda() or is_musa()`` in
``ServerArgs._handle_mamba_radix_cache`` (sglang/srt/server_args.py:2403): extra_buffer
needs the CUDA (or MUSA) FLA kernels, and torch.cuda.is_available() is False here. Every
check before it runs, including the model-specific ones that read config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from launch_plan_cases import (
    FLAG_TABLES,
    ORIGIN_FLAGS,
    ORIGIN_OVERRIDES,
    ORIGIN_REFUSAL,
    QWEN_CONFIG,
    REPO,
    cache_dir,
    setting_variables,
)
from role_files import run_role_tasks

SGLANG_RADIX_ERROR = (
    "Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache when using "
    "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)
GPU_ONLY_ERROR = "Mamba extra_buffer is only supported on CUDA and MUSA devices with FLA backend"


# --------------------------------------------------------------------------------------
# The committed flag tables are the engines' real parsers
# --------------------------------------------------------------------------------------


def test_sglang_flag_table_is_sglangs_own_parser(sglang_venv, check_script):
    """Each version's committed table is what its parser dumps (tools/build-sglang-check-venv --dump-flags)."""
    committed = (FLAG_TABLES / f"sglang-{sglang_venv.version}.json").read_text()
    proc = check_script(sglang_venv.path, "sglang", ["--engine", "sglang", "--dump-flags"])
    assert proc["rc"] == 0, proc["stderr"][-3000:]
    assert json.loads(proc["stdout"])["version"] == sglang_venv.version
    assert proc["stdout"] == committed, (
        f"tools/deploytools/launch_plan/flags/sglang-{sglang_venv.version}.json is not SGLang's parser: "
        f"regenerate it with tools/build-sglang-check-venv --dump-flags {sglang_venv.version}"
    )


def test_transformers_flag_table_is_transformers_serve(transformers_venv, check_script):
    """The committed transformers table is what transformers serve's click command dumps."""
    committed = json.loads((FLAG_TABLES / "transformers-5.6.0.json").read_text())
    proc = check_script(transformers_venv, "transformers", ["--engine", "transformers", "--dump-flags"])
    assert proc["rc"] == 0, proc["stderr"][-3000:]
    assert json.loads(proc["stdout"]) == committed


# --------------------------------------------------------------------------------------
# The origin story's flags: SGLang's ValueError, and our refusal first
# --------------------------------------------------------------------------------------


def test_origin_flags_make_sglang_raise_its_radix_cache_error(
    sglang_check_venv, run_check, model_dir, launch_plan, ct129_kwargs
):
    model = model_dir(json.loads(QWEN_CONFIG.read_text()))
    argv = [
        str(sglang_check_venv / "bin" / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        *ORIGIN_FLAGS,
    ]
    rc, result = run_check(sglang_check_venv, "sglang", argv)
    assert rc == 1
    assert result["status"] == "refused"
    assert result["exception"] == "ValueError"
    assert result["message"] == f"ValueError: {SGLANG_RADIX_ERROR}"
    assert result["where"] == "sglang/srt/server_args.py:2453 in _handle_mamba_radix_cache"

    # The plan refuses the same flags first, with its own sentence, without any engine.
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(
            json.loads(QWEN_CONFIG.read_text()), **dict(ct129_kwargs, settings={}, overrides=ORIGIN_OVERRIDES)
        )
    assert str(err.value) == ORIGIN_REFUSAL


def test_derived_plan_passes_everything_a_cpu_host_can_check(sglang_check_venv, run_check, plan_for):
    plan = plan_for(sglang_check_venv)
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"], env=plan["env"])
    assert rc == 3, result
    assert result["status"] == "passed-gpu-less"
    assert result["exception"] == "AssertionError"
    assert result["assertion"] == "is_cuda() or is_musa()"
    assert result["error"] == GPU_ONLY_ERROR
    assert result["where"] == "sglang/srt/server_args.py:2403 in _handle_mamba_radix_cache"
    assert result["stage"] == "prepare_server_args"
    assert result["cuda_visible"] is False
    assert result["not_run"][:4] == [
        "the rest of _handle_mamba_radix_cache",
        "the rest of _handle_model_specific_adjustments",
        "_handle_sampling_backend",
        "_handle_attention_backend_compatibility",
    ]
    assert "_handle_speculative_decoding" in result["not_run"]
    assert result["notes"] == [
        "no CUDA device here: validated with --device cuda, which SGLang picks on a GPU "
        "host (without it SGLang stops at once: No accelerator is available)"
    ]


def test_model_specific_checks_before_the_gpu_stop_do_run(sglang_check_venv, run_check, plan_for, launch_plan):
    """SGLang's radix-cache check sits before the GPU-only assertion and refuses for real."""
    plan = plan_for(sglang_check_venv)
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"] + ["--disable-radix-cache"], env=plan["env"])
    assert rc == 1
    assert result["message"] == (
        "ValueError: mamba extra_buffer is not compatible with --disable-radix-cache Overlap scheduling is already "
        "supported with no_buffer + disable_radix_cache. Please use --mamba-scheduler-strategy no_buffer instead."
    )
    with pytest.raises(
        launch_plan.PlanError,
        match=r"^inference_server_overrides\['--disable-radix-cache'\] "
        r"disables the radix cache, which SGLang refuses together",
    ):
        plan_for(sglang_check_venv, overrides={"--disable-radix-cache": True})


def test_sglangs_parser_refuses_what_the_plan_refuses_first(sglang_check_venv, run_check, plan_for, launch_plan):
    plan = plan_for(sglang_check_venv)
    argv = plan["argv"][:-1] + ["extra"]  # --mamba-scheduler-strategy extra
    rc, result = run_check(sglang_check_venv, "sglang", argv, env=plan["env"])
    assert rc == 1
    assert result["message"] == (
        "SGLang's parser refused the argv: sglang serve: error: argument "
        "--mamba-scheduler-strategy: invalid choice: 'extra' (choose from 'auto', "
        "'no_buffer', 'extra_buffer')"
    )
    with pytest.raises(launch_plan.PlanError, match=r"accepts only auto, extra_buffer, no_buffer: use one of them"):
        plan_for(sglang_check_venv, overrides={"--mamba-scheduler-strategy": "extra"})


def test_unknown_flags_fail_on_the_host_and_abbreviations_slip_through(sglang_check_venv, run_check, plan_for):
    """Why the plan wants flags in full: SGLang's argparse takes any unique prefix."""
    plan = plan_for(sglang_check_venv)
    rc, result = run_check(
        sglang_check_venv, "sglang", plan["argv"] + ["--speculative-num-stepz", "3"], env=plan["env"]
    )
    assert rc == 1
    assert result["message"] == (
        "SGLang's parser refused the argv: sglang serve: error: unrecognized arguments: --speculative-num-stepz 3"
    )
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"] + ["--max-running-req", "8"], env=plan["env"])
    assert rc == 3, "argparse accepted the abbreviation; only the plan refuses it"


def test_host_with_gpus_but_no_cuda_in_torch_is_refused(sglang_check_venv, run_check, plan_for):
    plan = plan_for(sglang_check_venv)
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"], env=plan["env"], gpus=2)
    assert rc == 1
    assert result["message"] == (
        f"torch 2.13.0+cpu in {sglang_check_venv} sees no CUDA device although preflight found 2 GPU(s): check the "
        "NVIDIA driver (torch is built for CUDA None)."
    )


def test_missing_executable_is_refused(sglang_check_venv, run_check, plan_for, tmp_path):
    plan = plan_for(tmp_path / "no-venv")
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"], env=plan["env"])
    assert rc == 1
    assert result["message"] == (
        f"the plan's executable {tmp_path}/no-venv/bin/sglang does not exist or is not executable on this host"
    )


# --------------------------------------------------------------------------------------
# DFLASH: the drafter beside the real target (files/models/dflash-drafter-27b.config.json,
# a drafter config SGLang 0.5.11 served with Qwen3.6-27B's real config on one H200)
# --------------------------------------------------------------------------------------

DRAFTER_CONFIG = REPO / "files" / "models" / "dflash-drafter-27b.config.json"


@pytest.fixture()
def dflash_plan(plan_for, model_dir, ct129_kwargs):
    """ct129's plan with DFLASH and the drafter in a directory of its own."""

    def make(venv: Path, **settings: Any) -> dict[str, Any]:
        drafter = json.loads(DRAFTER_CONFIG.read_text())
        base = {k: v for k, v in ct129_kwargs["settings"].items() if not k.startswith("speculative_")}
        return plan_for(
            venv,
            settings=dict(base, speculative_algorithm="DFLASH", **settings),
            draft_config=drafter,
            draft_path=str(model_dir(drafter)),
        )

    return make


def test_dflash_plan_with_no_buffer_passes_sglangs_whole_validation(sglang_check_venv, run_check, dflash_plan):
    """Without extra_buffer nothing stops SGLang's check on CPU: it runs DFLASH's own handling."""
    plan = dflash_plan(sglang_check_venv, disable_radix_cache=True)
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"], env=plan["env"])
    assert rc == 0, result
    resolved = result["resolved"]
    assert resolved["speculative_algorithm"] == "DFLASH"
    assert resolved["speculative_num_draft_tokens"] == 16
    assert (resolved["speculative_num_steps"], resolved["speculative_eagle_topk"]) == (1, 1)
    # SGLang turns the overlap scheduler off itself: the plan does not need the flag.
    assert resolved["disable_overlap_schedule"] is True and "--disable-overlap-schedule" not in plan["argv"]
    assert resolved["mamba_scheduler_strategy"] == "no_buffer" and resolved["disable_radix_cache"] is True


def test_sglang_takes_the_draft_tokens_from_the_drafters_block_size(sglang_check_venv, run_check, dflash_plan):
    """The plan's --speculative-num-draft-tokens 16 is what SGLang reads from the drafter itself."""
    plan = dflash_plan(sglang_check_venv, disable_radix_cache=True)
    argv = list(plan["argv"])
    i = argv.index("--speculative-num-draft-tokens")
    del argv[i : i + 2]
    rc, result = run_check(sglang_check_venv, "sglang", argv, env=plan["env"])
    assert rc == 0, result
    assert result["resolved"]["speculative_num_draft_tokens"] == 16


def test_dflash_with_extra_buffer_passes_up_to_the_gpu_stop(sglang_check_venv, run_check, dflash_plan):
    plan = dflash_plan(sglang_check_venv)
    argv = plan["argv"]
    assert argv[argv.index("--mamba-scheduler-strategy") + 1] == "extra_buffer"
    rc, result = run_check(sglang_check_venv, "sglang", plan["argv"], env=plan["env"])
    assert rc == 3, result
    assert result["error"] == GPU_ONLY_ERROR


def test_dflash_without_a_drafter_makes_sglang_raise_and_the_plan_refuses_first(
    sglang_check_venv, run_check, dflash_plan, launch_plan
):
    plan = dflash_plan(sglang_check_venv, disable_radix_cache=True)
    argv = list(plan["argv"])
    i = argv.index("--speculative-draft-model-path")
    del argv[i : i + 2]
    rc, result = run_check(sglang_check_venv, "sglang", argv, env=plan["env"])
    assert rc == 1
    assert (
        result["message"] == "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."
    )
    with pytest.raises(launch_plan.PlanError, match="which drafts with a separate model, but no drafter is synced"):
        _refuse_without_drafter(launch_plan)


def _refuse_without_drafter(launch_plan) -> None:
    """The DFLASH settings without a drafter, through the plan."""
    # fmt: off
    launch_plan.build_plan(json.loads(QWEN_CONFIG.read_text()), engine="sglang", engine_version="0.5.11",
                           venv_dir="/v", model_path="/m", host="0.0.0.0", port=30000,
                           gpus=[{"index": 0, "name": "GPU", "memory_mib": 143771}] * 2,
                           settings={"tensor_parallel_size": 2, "speculative_algorithm": "DFLASH"})
    # fmt: on


# --------------------------------------------------------------------------------------
# transformers serve
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rehearsal_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the module's rehearsal plans: the plan's environment points into it,
    so every transformers check here has the same environment and one check server (conftest's
    CheckServers, one per environment) imports transformers once for all of them."""
    return tmp_path_factory.mktemp("rehearsal-cache")


@pytest.fixture()
def rehearsal_plan(launch_plan, tiny_config, model_dir, transformers_venv, rehearsal_cache_dir):
    """The CPU rehearsal plan for transformers serve, with a model directory of the test's own."""
    model = model_dir(tiny_config)
    return launch_plan.build_plan(
        tiny_config,
        engine="transformers",
        engine_version="5.6.0",
        venv_dir=str(transformers_venv),
        model_path=str(model),
        host="127.0.0.1",
        port=8000,
        gpus=[],
        settings={"device": "cpu", "dtype": "auto"},
        cache_dir=str(rehearsal_cache_dir),
    )


def test_transformers_plan_passes_transformers_serves_parser(transformers_venv, run_check, rehearsal_plan):
    rc, result = run_check(transformers_venv, "transformers", rehearsal_plan["argv"], env=rehearsal_plan["env"])
    assert rc == 0, result
    assert result["status"] == "passed"
    assert result["resolved"]["model_type"] == "qwen3_5_text"
    assert result["resolved"]["architectures"] == ["Qwen3_5ForCausalLM"]
    assert result["resolved"]["port"] == 8000


def test_the_check_runs_once_per_plan_and_a_plan_checked_before_skips_it(tmp_path, rehearsal_plan, transformers_venv):
    """validate.yml's record: plan A, plan B, then A again runs the engine's check twice, not three times."""
    venv = tmp_path / "venv"
    runs = tmp_path / "check-runs"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    # The venv's python counts the checks it ran and hands them to the real venv.
    python.write_text(f'#!/bin/sh\necho "$*" >> {runs}\nexec {transformers_venv}/bin/python "$@"\n')
    python.chmod(0o755)

    def deploy(mark: str) -> str:
        plan = dict(rehearsal_plan, env=dict(rehearsal_plan["env"], PLAN_MARK=mark))
        facts = {
            "inference_server_plan": plan,
            "inference_server_engine": "transformers",
            "inference_server_check_requires_gpu": False,
            "preflight_gpus": [],
            "ml_env_venv_dir": str(venv),
            "model_sync_model_dir": rehearsal_plan["argv"][2],
        }
        proc = run_role_tasks(tmp_path, facts, ["validate.yml"], check_mode=False)
        assert proc.returncode == 0, proc.stdout[-4000:]
        return " ".join(proc.stdout.split())

    def checks() -> int:
        return len(runs.read_text().splitlines()) if runs.exists() else 0

    deploy("a")
    assert checks() == 1
    second = deploy("b")
    assert checks() == 2 and "not run again" not in second
    third = deploy("a")
    assert checks() == 2, runs.read_text()
    assert "The engine's check passed this plan, venv and model revision before" in third
    record = (venv / "launch-plan-checked.sha256").read_text().split()
    assert len(record) == 2 and len(set(record)) == 2


def test_transformers_serve_refuses_a_bad_value(transformers_venv, run_check, rehearsal_plan):
    argv = list(rehearsal_plan["argv"])
    argv[argv.index("--port") + 1] = "eighty"
    rc, result = run_check(transformers_venv, "transformers", argv, env=rehearsal_plan["env"])
    assert rc == 1
    assert result["message"] == (
        "transformers serve refused the argv: Invalid value for '--port': 'eighty' is not a valid integer."
    )


def test_transformers_check_refuses_an_unknown_model_type(transformers_venv, run_check, rehearsal_plan):
    model = Path(rehearsal_plan["argv"][2])  # transformers serve MODEL_DIR ...
    (model / "config.json").write_text(json.dumps({"model_type": "no_such_model", "architectures": ["X"]}))
    rc, result = run_check(transformers_venv, "transformers", rehearsal_plan["argv"], env=rehearsal_plan["env"])
    assert rc == 1
    assert result["exception"] == "ValueError"
    assert "no_such_model" in result["message"]


# --------------------------------------------------------------------------------------
# The role's validate.yml, run by Ansible in check mode on this machine
# --------------------------------------------------------------------------------------


@pytest.fixture()
def role_facts(sglang_check_venv, model_dir, ct129) -> dict[str, Any]:
    offline = ct129["offline"]
    group = ct129["group"]
    return {
        "preflight_gpus": offline["gpus"],
        "ml_env_venv_dir": str(sglang_check_venv),
        "ml_env_engine_version": offline["engine_version"],
        "model_sync_model_dir": str(model_dir(json.loads(QWEN_CONFIG.read_text()))),
        "model_sync_config": json.loads(QWEN_CONFIG.read_text()),
        "model_sync_weights_bytes": offline["weights_bytes"],
        "inference_server_engine": group["inference_server_engine"],
        "inference_server_host": "127.0.0.1",
        "inference_server_port": group["inference_server_port"],
        **setting_variables(group),
        "inference_server_overrides": {},
        "inference_server_cache_dir": str(cache_dir() / "jit"),
        "inference_server_check_requires_gpu": False,
    }


def test_validate_tasks_pass_the_plan_in_check_mode(tmp_path, role_facts):
    proc = run_role_tasks(tmp_path, role_facts, ["plan.yml", "validate.yml"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "SGLang's validation passed everything a host without a GPU can check" in proc.stdout
    assert "Not run here: the rest of _handle_mamba_radix_cache" in proc.stdout


def test_validate_tasks_stop_the_play_with_sglangs_message(tmp_path, role_facts, sglang_check_venv):
    argv = [
        str(sglang_check_venv / "bin" / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        role_facts["model_sync_model_dir"],
        *ORIGIN_FLAGS,
    ]
    facts = dict(role_facts, inference_server_plan={"argv": argv, "env": {}, "notes": []})
    proc = run_role_tasks(tmp_path, facts, ["validate.yml"])
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert "Stop the play with the engine's own message when it refuses the plan" in proc.stdout
    flat = " ".join(proc.stdout.split())
    assert (
        f"The sglang launch plan was refused by the engine's own check (exit 1): ValueError: "
        f"{SGLANG_RADIX_ERROR} (at sglang/srt/server_args.py:2453 in _handle_mamba_radix_cache)"
    ) in flat


def test_check_mode_skips_the_check_before_the_venv_exists(tmp_path, role_facts):
    facts = dict(role_facts, ml_env_venv_dir=str(tmp_path / "not-built-yet"))
    proc = run_role_tasks(tmp_path, facts, ["plan.yml", "validate.yml"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    flat = " ".join(proc.stdout.split()).replace("''", "'")  # the YAML callback doubles quotes
    assert (
        f"Check mode: {tmp_path}/not-built-yet/bin/python not on the host yet (ml_env and model_sync only "
        "report in check mode), so the engine's own check runs on the real deploy."
    ) in flat
    assert "Check the launch plan with the engine's own parser" not in flat

    proc = run_role_tasks(tmp_path, facts, ["plan.yml", "validate.yml"], check_mode=False)
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert (
        f"The launch plan cannot be checked: {tmp_path}/not-built-yet/bin/python missing on the host, although "
        "ml_env and model_sync ran before: check ml_env_venv_dir and model_sync_model_dir."
    ) in " ".join(proc.stdout.split())
