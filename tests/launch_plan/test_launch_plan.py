"""The launch_plan filter (filter_plugins/launch_plan.py) and tools/launch-plan.

The plan for the real Qwen3.6-27B config.json on ct129 (2x RTX A6000 48 GB) must be the
working launch of the origin story; every rule of docs/launch-plan.md refuses its bad
input with its own one-sentence message.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from typing import Any

import pytest
from launch_plan_cases import ORIGIN_OVERRIDES, ORIGIN_REFUSAL, REPO, launch_plan_tool, load_yaml, profile_settings

CACHE = "/var/cache/inference-server"
CT129_ARGV = [
    "/root/ml-env.d/0123456789ab/bin/sglang",
    "serve",
    "--model-path",
    "/root/models/Qwen3.6-27B",
    "--host",
    "0.0.0.0",
    "--port",
    "30000",
    "--tensor-parallel-size",
    "2",
    "--dtype",
    "bfloat16",
    "--trust-remote-code",
    # Set by the memory budget (tests/launch_plan/test_launch_plan_budget.py): the KV cache of 4 running requests
    # (target_concurrency) holds 119495 tokens per GPU, SGLang's own fraction for a 48 GB GPU.
    "--context-length",
    "118784",
    "--mem-fraction-static",
    "0.717",
    "--max-running-requests",
    "4",
    "--enable-metrics",
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
    "--mamba-scheduler-strategy",
    "extra_buffer",
]
CT129_ENV = {
    "CUDA_CACHE_PATH": f"{CACHE}/nv-compute",
    "FLASHINFER_WORKSPACE_BASE": CACHE,
    "HF_HOME": f"{CACHE}/huggingface",
    "HF_HUB_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "SGLANG_CACHE_DIR": f"{CACHE}/sglang",
    "SGLANG_DG_CACHE_DIR": f"{CACHE}/deep_gemm",
    "SGLANG_ENABLE_SPEC_V2": "1",
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/torchinductor",
    "TRITON_CACHE_DIR": f"{CACHE}/triton",
    "TVM_FFI_CACHE_DIR": f"{CACHE}/tvm-ffi",
    "XDG_CACHE_HOME": CACHE,
}


def flat(config: dict[str, Any]) -> dict[str, Any]:
    """The same model as a flat config: text_config's keys at the top level."""
    out = {k: v for k, v in config.items() if k != "text_config"}
    out.update(config["text_config"])
    return out


# --------------------------------------------------------------------------------------
# The working plan
# --------------------------------------------------------------------------------------


def test_ct129_plan_is_the_working_launch_of_the_origin_story(launch_plan, qwen_config, ct129_kwargs):
    plan = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    assert plan["argv"] == CT129_ARGV
    assert plan["env"] == CT129_ENV
    assert list(plan["env"]) == sorted(plan["env"])
    notes = "\n".join(plan["notes"])
    assert "48 linear_attention + 16 full_attention (hybrid)" in notes
    assert "weights 25.9 GiB per GPU + 8.0 GiB headroom fit" in notes
    assert "entry point: sglang serve (SGLang 0.5.11 >= 0.5.5)" in notes


def test_plan_is_deterministic(launch_plan, qwen_config, ct129_kwargs):
    first = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    shuffled = dict(ct129_kwargs, settings=dict(reversed(list(ct129_kwargs["settings"].items()))))
    assert launch_plan.build_plan(copy.deepcopy(qwen_config), **shuffled) == first


def test_defaults_fill_steps_topk_draft_with_3_1_4(launch_plan, qwen_config, ct129_kwargs):
    settings = {
        k: v
        for k, v in ct129_kwargs["settings"].items()
        if not k.startswith("speculative_num") and k != "speculative_eagle_topk"
    }
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, settings=settings))
    assert plan["argv"] == CT129_ARGV
    assert any("SGLang's own choice 3/1/4" in note for note in plan["notes"])


def test_flat_config_gives_the_same_plan_as_nested(launch_plan, qwen_config, ct129_kwargs):
    assert launch_plan.build_plan(flat(qwen_config), **ct129_kwargs)["argv"] == CT129_ARGV


def flag_lines(argv: list[str]) -> list[list[str]]:
    """Split an argv the way the unit does: a new line at every flag."""
    lines: list[list[str]] = [[]]
    for arg in argv:
        if arg.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(arg)
    return lines


def test_every_argv_flag_is_followed_by_its_own_value(launch_plan, qwen_config, ct129_kwargs):
    plan = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    lines = flag_lines(plan["argv"])
    assert lines[0] == ["/root/ml-env.d/0123456789ab/bin/sglang", "serve"]
    assert [len(line) for line in lines[1:]] == [2, 2, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2, 2, 2, 2]


def test_sglang_before_0_5_5_uses_launch_server(launch_plan, qwen_config, ct129_kwargs):
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, engine_version="0.5.4"))
    assert plan["argv"][:3] == ["/root/ml-env.d/0123456789ab/bin/python", "-m", "sglang.launch_server"]
    assert plan["argv"][3:] == CT129_ARGV[2:]
    assert any("no flag table for sglang 0.5.4" in note for note in plan["notes"])


def test_overrides_add_replace_and_remove_flags(launch_plan, qwen_config, ct129_kwargs):
    overrides = {
        "--mem-fraction-static": 0.75,
        "--tp-size": 2,
        "--enable-metrics": None,
        "--trust-remote-code": None,
        "--context-length": "64Ki",
        "--reasoning-parser": "qwen3",
    }
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, overrides=overrides))
    budgeted = ["--context-length", "118784", "--mem-fraction-static", "0.717"]
    expected = [a for a in CT129_ARGV if a not in ("--trust-remote-code", "--enable-metrics", *budgeted)] + [
        "--context-length",
        "64Ki",
        "--mem-fraction-static",
        "0.75",
        "--reasoning-parser",
        "qwen3",
    ]
    assert plan["argv"] == expected


def test_zero_and_list_values_reach_argv(launch_plan, qwen_config, ct129_kwargs):
    overrides = {"--base-gpu-id": 0, "--cuda-graph-bs": [1, 2, 4]}
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, overrides=overrides))
    assert plan["argv"] == [*CT129_ARGV, "--base-gpu-id", "0", "--cuda-graph-bs", "1", "2", "4"]
    assert flag_lines(plan["argv"])[-2:] == [["--base-gpu-id", "0"], ["--cuda-graph-bs", "1", "2", "4"]]


def test_algorithm_in_overrides_leaves_steps_to_sglang(launch_plan, qwen_config, ct129_kwargs):
    config = copy.deepcopy(qwen_config)
    config["text_config"]["layer_types"] = ["full_attention"] * 64
    settings = {"tensor_parallel_size": 2}
    plan = launch_plan.build_plan(
        config, **dict(ct129_kwargs, settings=settings, overrides={"--speculative-algorithm": "NEXTN"})
    )
    assert plan["argv"][-2:] == ["--speculative-algorithm", "NEXTN"]
    assert (
        "speculative decoding NEXTN: steps, top-k and draft tokens left to SGLang, which picks 3/1/4 for most models"
    ) in plan["notes"]


def test_disable_radix_cache_setting_keeps_no_buffer(launch_plan, qwen_config, ct129_kwargs):
    settings = dict(ct129_kwargs["settings"], disable_radix_cache=True)
    plan = launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, settings=settings))
    assert "--mamba-scheduler-strategy" not in plan["argv"]
    assert "--disable-radix-cache" in plan["argv"]
    assert any("no prefix caching" in note for note in plan["notes"])


def test_non_hybrid_model_gets_no_mamba_flags(launch_plan, qwen_config, ct129_kwargs):
    config = copy.deepcopy(qwen_config)
    config["text_config"]["layer_types"] = ["full_attention"] * 64
    plan = launch_plan.build_plan(config, **settings_with(ct129_kwargs, min_context_length=32768))
    assert "--mamba-scheduler-strategy" not in plan["argv"]
    assert "SGLANG_ENABLE_SPEC_V2" not in plan["env"]


def test_settings_flags_exist_in_the_engines_flag_tables(launch_plan):
    for setting in launch_plan.SETTINGS:
        for engine, flag in setting.flag.items():
            table = launch_plan.load_flag_table(engine, "0.5.11" if engine == "sglang" else "5.6.0")
            assert table.resolve(flag) is not None, (setting.key, engine, flag)


# --------------------------------------------------------------------------------------
# Refusals: each bad input gives its own one-sentence message
# --------------------------------------------------------------------------------------


def settings_with(ct129_kwargs: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return dict(ct129_kwargs, settings=dict(ct129_kwargs["settings"], **changes))


def no_mtp(config: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(config)
    config["text_config"]["mtp_num_hidden_layers"] = 0
    return config


EIGHT_GPUS = [{"index": i, "name": "NVIDIA RTX A6000", "memory_mib": 49140} for i in range(8)]

# fmt: off
REFUSALS = {
    "nextn-without-mtp-head": (
        no_mtp, {},
        "inference_server_speculative_algorithm is NEXTN, which drafts with the model's own MTP head, "
        "but Qwen3_5ForConditionalGeneration has mtp_num_hidden_layers 0 in config.json: set "
        "inference_server_speculative_algorithm to null, or to EAGLE or DFLASH with a drafter in "
        "model_sync_draft_source."),
    "tp1-does-not-fit-48gb": (
        None, {"settings": {"tensor_parallel_size": 1}},
        "inference_server_tensor_parallel_size is 1, but the weights need 51.8 GiB per GPU plus 8.0 GiB "
        "headroom (inference_server_gpu_memory_headroom_gib) and each GPU has 48.0 GiB: set it to 2."),
    "tp-exceeds-gpus": (
        None, {"settings": {"tensor_parallel_size": 4}},
        "inference_server_tensor_parallel_size is 4, but the host has 2 GPU(s): set it to 1 or 2."),
    "tp-does-not-divide-attention-heads": (
        None, {"settings": {"tensor_parallel_size": 5}, "gpus": EIGHT_GPUS},
        "inference_server_tensor_parallel_size is 5, which does not divide the model's 24 attention heads "
        "(num_attention_heads): set it to 1, 2, 4 or 8."),
    "tp-does-not-divide-linear-heads": (
        None, {"settings": {"tensor_parallel_size": 3}, "gpus": EIGHT_GPUS},
        "inference_server_tensor_parallel_size is 3, which does not divide the model's 16 linear-attention "
        "key heads (linear_num_key_heads): set it to 1, 2, 4 or 8."),
    "no-gpus": (
        None, {"gpus": []},
        "preflight_gpus is empty (no NVIDIA GPU found on the host), but the sglang engine needs GPUs: fix the "
        "driver or put the host in the rehearsal group."),
    "mem-fraction-below-weights": (
        None, {"overrides": {"--mem-fraction-static": 0.5}},
        "inference_server_overrides['--mem-fraction-static'] is 0.5, but the weights alone take 25.9 GiB of the "
        "24.0 GiB it reserves per GPU: raise it or the tensor-parallel size."),
    "disable-radix-cache-with-extra-buffer": (
        None, {"overrides": {"--disable-radix-cache": True}},
        "inference_server_overrides['--disable-radix-cache'] disables the radix cache, which SGLang refuses "
        "together with --mamba-scheduler-strategy extra_buffer, set by the plan (derived from "
        "inference_server_speculative_algorithm): set inference_server_disable_radix_cache to true instead, so "
        "the plan keeps no_buffer."),
    "explicit-extra-buffer-and-disable-radix-cache": (
        None, {"settings": {"mamba_scheduler_strategy": "extra_buffer", "disable_radix_cache": True}},
        "inference_server_disable_radix_cache disables the radix cache, which SGLang refuses together "
        "with --mamba-scheduler-strategy extra_buffer, set by inference_server_mamba_scheduler_strategy: "
        "drop one of the two."),
    "no-buffer-with-radix-cache": (
        None, {"settings": {"mamba_scheduler_strategy": "no_buffer"}},
        "speculative decoding (inference_server_speculative_algorithm: NEXTN) on the hybrid model "
        "Qwen3_5ForConditionalGeneration with the radix cache needs --mamba-scheduler-strategy extra_buffer and "
        "SGLANG_ENABLE_SPEC_V2=1, not no_buffer, and SGLang refuses it at start-up: set "
        "inference_server_mamba_scheduler_strategy to extra_buffer or leave it unset so the plan derives "
        "it, or set inference_server_disable_radix_cache to true."),
    "override-removes-extra-buffer": (
        None, {"overrides": {"--mamba-scheduler-strategy": None}},
        "speculative decoding (inference_server_speculative_algorithm: NEXTN) on the hybrid model "
        "Qwen3_5ForConditionalGeneration with the radix cache needs --mamba-scheduler-strategy extra_buffer and "
        "SGLANG_ENABLE_SPEC_V2=1, not no_buffer (the default auto), and SGLang refuses it at start-up: remove "
        "inference_server_overrides['--mamba-scheduler-strategy'], which removes the extra_buffer the plan "
        "derived, or set inference_server_disable_radix_cache to true."),
    "origin-story-flags": (None, {"settings": None, "overrides": ORIGIN_OVERRIDES}, ORIGIN_REFUSAL),
    "spec-v2-switched-off": (
        None, {"environment": {"SGLANG_ENABLE_SPEC_V2": "0"}},
        "inference_server_environment sets SGLANG_ENABLE_SPEC_V2 to '0', but speculative decoding with "
        "extra_buffer on the hybrid model Qwen3_5ForConditionalGeneration needs it at 1: remove it from "
        "inference_server_environment."),
    "environment-bad-name": (
        None, {"environment": {"NOT-A-NAME": "1"}},
        "inference_server_environment has the key 'NOT-A-NAME', which is not an environment variable name: use "
        "letters, digits and underscores."),
    "track-interval-below-draft-tokens": (
        None, {"settings": {"mamba_track_interval": 2}},
        "inference_server_mamba_track_interval is 2, less than the 4 speculative draft tokens, which "
        "SGLang refuses with extra_buffer: set it to at least 4."),
    "track-interval-not-divisible-by-page-size": (
        None, {"settings": {"mamba_track_interval": 48, "page_size": 32}},
        "inference_server_mamba_track_interval is 48, which is not divisible by --page-size 32 (set by "
        "inference_server_page_size): set inference_server_mamba_track_interval to a multiple of 32."),
    "default-track-interval-not-divisible-by-page-size": (
        None, {"overrides": {"--page-size": 128, "--mamba-track-interval": 192}},
        "inference_server_overrides['--mamba-track-interval'] is 192, which is not divisible by --page-size 128 "
        "(set by inference_server_overrides['--page-size']): set inference_server_mamba_track_interval to a "
        "multiple of 128."),
    "page-size-and-linear-attention-chunk": (
        None, {"settings": {"page_size": 48}},
        "inference_server_page_size is 48, but with extra_buffer the page size and SGLang's "
        "linear-attention chunk size 64 must divide one another: use a power of two such as 16, 32, 64 or 128."),
    "only-draft-tokens-set": (
        None, {"settings": {"speculative_num_steps": None, "speculative_eagle_topk": None,
                            "speculative_num_draft_tokens": 1}},
        "inference_server_speculative_num_draft_tokens sets --speculative-num-draft-tokens without "
        "--speculative-num-steps and --speculative-eagle-topk: SGLang needs all three or none, so set all three "
        "(3, 1, 4 is SGLang's own choice) or none."),
    "draft-not-steps-plus-one-with-topk-1": (
        None, {"settings": {"speculative_num_draft_tokens": 5}},
        "inference_server_speculative_num_draft_tokens is 5, but with speculative_eagle_topk 1 SGLang uses "
        "speculative_num_steps + 1 = 4 draft tokens: set it to 4."),
    "speculative-params-without-algorithm": (
        None, {"settings": {"speculative_algorithm": None}},
        "inference_server_speculative_num_steps sets --speculative-num-steps without a speculative "
        "algorithm: set inference_server_speculative_algorithm or remove it."),
    "unknown-flag": (
        None, {"overrides": {"--speculative-num-stepz": 3}},
        "inference_server_overrides['--speculative-num-stepz']: sglang 0.5.11 has no flag --speculative-num-stepz "
        "(did you mean --speculative-num-steps? write flags in full): fix or remove it."),
    "abbreviated-flag": (
        None, {"overrides": {"--tp": 2}},
        "inference_server_overrides['--tp']: sglang 0.5.11 has no flag --tp (did you mean --tp-size? write flags "
        "in full): fix or remove it."),
    "bad-choice": (
        None, {"settings": {"dtype": "bf16"}},
        "inference_server_dtype sets --dtype to 'bf16', but sglang accepts only auto, bfloat16, float, "
        "float16, float32, half: use one of them."),
    "not-an-integer": (
        None, {"overrides": {"--max-running-requests": "many"}},
        "inference_server_overrides['--max-running-requests'] sets --max-running-requests to 'many', which is not "
        "an integer: give --max-running-requests an integer."),
    "bare-flag-with-value": (
        None, {"overrides": {"--enable-metrics": "yes"}},
        "inference_server_overrides['--enable-metrics'] is 'yes', but --enable-metrics takes no value: set it to "
        "true to pass the flag or to null to remove it."),
    "valued-flag-without-value": (
        None, {"overrides": {"--mem-fraction-static": True}},
        "inference_server_overrides['--mem-fraction-static'] is true, but --mem-fraction-static needs a value: "
        "give the value instead of true."),
    "deprecated-flag": (
        None, {"overrides": {"--stream-output": True}},
        "inference_server_overrides['--stream-output']: --stream-output is deprecated in sglang 0.5.11, use "
        "--incremental-streaming-output instead: remove it."),
    "pinned-flag": (
        None, {"overrides": {"--port": 8080}},
        "inference_server_overrides['--port'] would replace --port, which the plan takes from "
        "inference_server_port: set that variable instead."),
    "context-longer-than-model": (
        None, {"overrides": {"--context-length": "300k"}},
        "inference_server_overrides['--context-length'] is 300000, more than the model's max_position_embeddings "
        "262144: lower it (SGLang refuses it unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is in "
        "inference_server_environment)."),
    "unknown-setting": (
        None, {"settings": {"tensor_paralel_size": 2}},
        "the launch plan has no setting 'tensor_paralel_size': use one of device, tensor_parallel_size, "
        "dtype, trust_remote_code, context_length, mem_fraction_static, max_running_requests, page_size, "
        "served_model_name, enable_metrics, disable_radix_cache, speculative_algorithm, speculative_num_steps, "
        "speculative_eagle_topk, speculative_num_draft_tokens, mamba_scheduler_strategy, mamba_track_interval, "
        "gpu_memory_headroom_gib, target_concurrency, min_context_length (each set as inference_server_<setting>), "
        "or pass the engine flag through inference_server_overrides."),
    "wrongly-typed-setting": (
        None, {"settings": {"tensor_parallel_size": "two"}},
        "inference_server_tensor_parallel_size is 'two', but it must be a positive integer: correct it in "
        "the host's group_vars or host_vars."),
    "tp-zero": (
        None, {"overrides": {"--tensor-parallel-size": 0}},
        "inference_server_overrides['--tensor-parallel-size'] is 0: set it to 1 or more."),
    "fractional-tp": (
        None, {"overrides": {"--tp-size": 2.5}},
        "inference_server_overrides['--tp-size'] sets --tensor-parallel-size to 2.5, which is not an integer: give "
        "--tensor-parallel-size an integer."),
    "list-item-not-an-integer": (
        None, {"overrides": {"--cuda-graph-bs": [1, "two"]}},
        "inference_server_overrides['--cuda-graph-bs'] sets --cuda-graph-bs to 'two', which is not an integer: give "
        "--cuda-graph-bs an integer."),
    "list-for-single-value": (
        None, {"overrides": {"--dtype": ["bfloat16"]}},
        "inference_server_overrides['--dtype'] is a list, but --dtype takes one value: give a single value."),
    "settings-not-a-mapping": (
        None, {"settings": "tp=2"},
        "the launch plan's settings must be a mapping of setting names to values, each set as its "
        "inference_server_<setting> variable: see docs/launch-plan.md for the settings."),
    "unknown-engine": (
        None, {"engine": "vllm"}, "inference_server_engine is 'vllm': use one of sglang, transformers."),
    "bad-port": (
        None, {"port": 70000}, "inference_server_port is 70000: use a TCP port between 1 and 65535."),
}
# fmt: on


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_bad_input_is_refused_with_its_message(launch_plan, qwen_config, ct129_kwargs, name):
    transform, changes, message = REFUSALS[name]
    config = transform(qwen_config) if transform else qwen_config
    kwargs = dict(ct129_kwargs)
    for key, value in changes.items():
        if key == "settings" and (value is None or isinstance(value, dict)):
            kwargs["settings"] = {} if value is None else {**ct129_kwargs["settings"], **value}
            kwargs["settings"] = {k: v for k, v in kwargs["settings"].items() if v is not None}
        else:
            kwargs[key] = value
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(config, **kwargs)
    assert str(err.value) == message
    assert str(err.value).count(". ") == 0, "one sentence"


def test_tp2_is_accepted_where_tp1_is_refused(launch_plan, qwen_config, ct129_kwargs):
    """The same host and model: TP 1 is refused (see above), TP 2 fits."""
    plan = launch_plan.build_plan(qwen_config, **settings_with(ct129_kwargs, tensor_parallel_size=2))
    assert plan["argv"][plan["argv"].index("--tensor-parallel-size") + 1] == "2"


def test_the_filter_raises_ansible_errors(plan_filters, qwen_config, ct129_kwargs):
    from ansible.errors import AnsibleFilterError

    filters = plan_filters
    assert filters["launch_plan"](qwen_config, **ct129_kwargs)["argv"] == CT129_ARGV
    with pytest.raises(AnsibleFilterError, match="set it to 2"):
        filters["launch_plan"](qwen_config, **settings_with(ct129_kwargs, tensor_parallel_size=1))


def test_the_filter_has_one_call_site() -> None:
    """plan.yml and precheck.yml import tasks/launch_plan.yml, the one place the filter is called."""
    calls = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "roles").rglob("*.yml"))
        if "| launch_plan(" in path.read_text()
    ]
    assert calls == ["roles/inference_server/tasks/launch_plan.yml"]
    for name in ("plan.yml", "precheck.yml"):
        tasks = load_yaml(f"roles/inference_server/tasks/{name}")
        assert any(task.get("ansible.builtin.import_tasks") == "launch_plan.yml" for task in tasks), name


def test_each_filter_plugin_loads_alone_and_names_its_filters() -> None:
    """Ansible loads every file of filter_plugins under a name of its own, in whatever order: each
    loads alone, in a fresh interpreter of the controller's venv (the package comes installed)."""
    load = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('ansible_plugin', sys.argv[1])\n"
        "module = sys.modules['ansible_plugin'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(module.FilterModule().filters()))\n"
    )
    expected = {
        "launch_plan": "['launch_plan', 'memory_budget', 'root_only_environment']",
        "systemd_unit": (
            "['systemd_env_file', 'systemd_env_file_line', 'systemd_env_line', 'systemd_exec_lines', 'systemd_quote', "
            "'systemd_text']"
        ),
        "probe_url": (
            "['engine_bind', 'engine_port', 'engine_url', 'front_scheme', 'front_url', 'fronted', 'is_loopback', "
            "'is_wildcard', 'local_api', 'probe_url']"
        ),
        "model_layout": "['model_current_link', 'model_serving_path']",
        "tls": "['tls_expires_within', 'tls_names', 'tls_problem']",
    }
    for name, filters in expected.items():
        proc = subprocess.run(
            [sys.executable, "-c", load, str(REPO / "filter_plugins" / f"{name}.py")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (proc.returncode, proc.stdout) == (0, filters + "\n"), f"{name}: {proc.stderr[-2000:]}"


# --------------------------------------------------------------------------------------
# transformers serve (CPU rehearsal profile)
# --------------------------------------------------------------------------------------


@pytest.fixture()
def rehearsal_kwargs() -> dict[str, Any]:
    group = load_yaml("group_vars/rehearsal.yml")
    return {
        "engine": group["inference_server_engine"],
        "engine_version": "5.6.0",
        "venv_dir": "/opt/ml-env.d/0123456789ab",
        "model_path": "/srv/models/tiny-qwen3.5/current",
        "host": group["inference_server_host"],
        "port": group["inference_server_port"],
        "gpus": [],
        "weights_bytes": None,
        "settings": profile_settings(group),
        "overrides": {},
        "cache_dir": CACHE,
    }


def test_transformers_plan_for_the_flat_tiny_model(launch_plan, tiny_config, rehearsal_kwargs):
    plan = launch_plan.build_plan(tiny_config, **rehearsal_kwargs)
    # fmt: off
    assert plan["argv"] == ["/opt/ml-env.d/0123456789ab/bin/transformers", "serve",
                            "/srv/models/tiny-qwen3.5/current", "--host", "127.0.0.1", "--port", "8000",
                            "--device", "cpu", "--dtype", "auto"]
    # fmt: on
    assert plan["env"] == {
        "HF_HOME": f"{CACHE}/huggingface",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "MKL_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE}/torchinductor",
        "TRITON_CACHE_DIR": f"{CACHE}/triton",
        "XDG_CACHE_HOME": CACHE,
    }
    assert (
        "transformers serve ignores the model's MTP head (mtp_num_hidden_layers 1): no speculative decoding "
        "in this profile"
    ) in plan["notes"]
    assert flag_lines(plan["argv"])[0] == plan["argv"][:3]  # the pinned model directory stays on line one


def test_transformers_environment_and_bare_flags(launch_plan, tiny_config, rehearsal_kwargs):
    kwargs = dict(
        rehearsal_kwargs,
        settings={"trust_remote_code": True},
        overrides={"--log-level": "info"},
        environment={"OMP_NUM_THREADS": 2, "HF_HUB_OFFLINE": None},
    )
    plan = launch_plan.build_plan(tiny_config, **kwargs)
    # fmt: off
    assert plan["argv"][3:] == ["--host", "127.0.0.1", "--port", "8000", "--device", "cpu",
                                "--trust-remote-code", "--log-level", "info"]
    # fmt: on
    assert plan["env"]["OMP_NUM_THREADS"] == "2"
    assert "HF_HUB_OFFLINE" not in plan["env"]
    assert list(plan["env"]) == sorted(plan["env"])


@pytest.mark.parametrize(
    "threads, environment, expected",
    [
        (None, {}, None),
        (3, {}, "3"),
        (3, {"OMP_NUM_THREADS": 2}, "2"),  # the operator's environment wins
    ],
)
def test_transformers_cpu_threads(launch_plan, tiny_config, rehearsal_kwargs, threads, environment, expected):
    kwargs = dict(rehearsal_kwargs, settings={"device": "cpu", "cpu_threads": threads}, environment=environment)
    plan = launch_plan.build_plan(tiny_config, **kwargs)
    assert plan["env"].get("OMP_NUM_THREADS") == expected
    assert plan["env"].get("MKL_NUM_THREADS") == (None if threads is None else str(threads))
    assert any("cpu_threads" in note for note in plan["notes"]) == (threads is not None)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"settings": {"cpu_threads": 0}},
            "inference_server_cpu_threads is 0, but it must be a positive integer: correct it in the host's "
            "group_vars or host_vars.",
        ),
        (
            {"settings": {"tensor_parallel_size": 1}},
            "inference_server_tensor_parallel_size does not apply to the transformers engine: remove it from "
            "this host's group_vars or host_vars.",
        ),
        (
            {"overrides": {"--speculative-algorithm": "NEXTN"}},
            "inference_server_overrides['--speculative-algorithm']: transformers 5.6.0 has no flag "
            "--speculative-algorithm: fix or remove it.",
        ),
        (
            {"overrides": {"--model-timeout": "soon"}},
            "inference_server_overrides['--model-timeout'] sets --model-timeout to 'soon', which is not an "
            "integer: give --model-timeout an integer.",
        ),
    ],
)
def test_transformers_refusals(launch_plan, tiny_config, rehearsal_kwargs, changes, message):
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(tiny_config, **dict(rehearsal_kwargs, **changes))
    assert str(err.value) == message


# --------------------------------------------------------------------------------------
# tools/launch-plan: the same plan, offline, from the inventory
# --------------------------------------------------------------------------------------


def expected_venv(ml_env_path: str, lock: str) -> str:
    lock_file = REPO / "roles" / "ml_env" / "files" / "locks" / f"{lock}.txt"
    if not lock_file.exists():
        return ml_env_path
    return f"{ml_env_path}.d/{hashlib.sha256(lock_file.read_bytes()).hexdigest()[:12]}"


def test_tool_prints_the_ct129_plan(ct129):
    proc = launch_plan_tool("ct129")
    assert proc.returncode == 0, proc.stderr
    head, _, notes = proc.stdout.partition("\nNotes:\n")
    printed = json.loads(head)
    venv = expected_venv(ct129["group"]["ml_env_path"], ct129["group"]["ml_env_lock"])
    # The filter's cases plan ct129's model at its old path; the inventory's is where the service account reads it.
    model = ct129["group"]["model_sync_source"]["path"]
    # Behind the API front the engine listens on loopback at the next port (docs/security.md).
    behind_front = {"/root/models/Qwen3.6-27B": model, "0.0.0.0": "127.0.0.1", "30000": "30001"}
    assert printed["argv"] == [f"{venv}/bin/sglang"] + [behind_front.get(word, word) for word in CT129_ARGV[1:]]
    assert venv.startswith("/opt/ml-env.d/") and model == "/srv/models/Qwen3.6-27B"
    assert printed["env"] == CT129_ENV
    assert "- user: inference:inference" in notes.splitlines(), "the exposure names the service account"
    assert "- entry point: sglang serve (SGLang 0.5.11 >= 0.5.5)" in notes.splitlines()
    # ct129's keys live in Ansible Vault, which the tool does not open: it names the file a deploy
    # writes with them, and that a deploy on 0.0.0.0 refuses to start without them.
    key_file = f"/etc/{ct129['group'].get('inference_server_unit_name', 'inference-server')}/api-key.yaml"
    assert (
        f"- api_key_file: {key_file} once inference_server_api_key is set (Ansible Vault: not read offline); "
        "a deploy refuses 0.0.0.0 without it"
    ) in notes.splitlines()
    assert f"- admin_api_key: admin-api-key in {key_file} once inference_server_admin_api_key is set" in notes
    assert (
        "- front: inference-server-front.service (nginx as inference-front) on 0.0.0.0:30000, the engine behind it "
        "on 127.0.0.1:30001"
    ) in notes.splitlines()


def test_tool_refuses_with_the_plans_sentence():
    proc = launch_plan_tool("ct129", "-e", "inference_server_tensor_parallel_size=1")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        "launch-plan: ct129: inference_server_tensor_parallel_size is 1, but the weights need 51.8 GiB per "
        "GPU plus 8.0 GiB headroom (inference_server_gpu_memory_headroom_gib) and each GPU has 48.0 GiB: "
        "set it to 2."
    )


def test_tool_usage_errors():
    assert launch_plan_tool().returncode == 2
    proc = launch_plan_tool("no-such-host")
    assert proc.returncode == 2
    assert "no-such-host is not a host of the inventory" in proc.stderr


def test_tool_plans_the_rehearsal_host_from_the_controller_model(tmp_path):
    model = tmp_path / "models" / "tiny-qwen3.5"
    model.mkdir(parents=True)
    (model / "config.json").write_text((REPO / "tests/launch_plan/fixtures/tiny-qwen3.5-flat.config.json").read_text())
    proc = launch_plan_tool("sim", "--json", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    group = load_yaml("group_vars/rehearsal.yml")
    venv = expected_venv(group["ml_env_path"], group["ml_env_lock"])
    # fmt: off
    assert result["plan"]["argv"] == [f"{venv}/bin/transformers", "serve", "/srv/models/tiny-qwen3.5/current",
                                      "--host", "127.0.0.1", "--port", "8000", "--device", "cpu", "--dtype", "auto"]
    # fmt: on
    assert any("transformers 5.6.0" in note for note in result["plan"]["notes"])  # the lock's pin
    # On loopback no key is needed, and none is asked for.
    assert result["exposure"]["api_key_file"] is None and result["exposure"]["admin_api_key"] is None


def test_tool_says_what_is_missing_offline(tmp_path):
    proc = launch_plan_tool("sim", cache=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"launch-plan: sim: The model's config.json for sim is not on the controller "
        f"({tmp_path}/models/tiny-qwen3.5/config.json): set offline_plan.model_config_file in host_vars/sim.yml or "
        "run make model."
    )
