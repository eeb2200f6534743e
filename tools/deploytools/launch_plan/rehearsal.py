"""Launch plan, rehearsal part: the argv, environment and notes of ``transformers serve``.

The CPU rehearsal profile serves a tiny model with ``transformers serve``, pinned to the model
directory (its positional argument), on the CPU by default, with no API key of its own (see
:func:`plan_transformers`). Standard library only.
"""

from __future__ import annotations

from typing import Any

from deploytools.launch_plan import common
from deploytools.launch_plan.model import ModelFacts


def plan_transformers(facts: ModelFacts, given: common.PlanInput) -> dict[str, Any]:
    """The ``transformers serve`` plan: pinned to the model directory, CPU by default.

    ``transformers serve`` has no API key: a key is refused (it would leave /v1/* open while
    looking protected) unless ``allow_unenforced_api_key`` says the operator knows.
    """
    notes: list[str] = []
    if given.api_key_file and not given.allow_unenforced_api_key:
        raise common.PlanError(
            "inference_server_api_key is set, but transformers serve has no API key support and would "
            "leave /v1/* open: leave it empty for this engine, or set "
            "inference_server_allow_unenforced_api_key to true to rehearse the key's path unenforced."
        )
    if given.api_key_file:
        notes.append(
            "transformers serve has no API key support: /v1/* is NOT protected on this host; the key is "
            f"written to {given.api_key_file} and sent by the gate only (inference_server_allow_unenforced_api_key)"
        )
    flags = common.FlagSet(given.table)
    flags.set("--host", given.host, "inference_server_host")
    flags.set("--port", given.port, "inference_server_port")
    flags.set(
        "--device",
        given.settings.get("device") or "cpu",
        common.setting_variable("device") if given.settings.get("device") else "the plan (default cpu)",
    )
    for spec in common.SETTINGS:
        flag = spec.flag.get("transformers")
        value = given.settings.get(spec.key)
        if flag and spec.key != "device" and value is not None and value is not False:
            flags.set(flag, value, spec.variable)
    pinned = {"--host": common.PINNED["--host"], "--port": common.PINNED["--port"]}
    added = common.apply_overrides(flags, given.overrides, pinned)
    common.check_values(flags)
    common.version_tuple(given.engine_version)
    env = {**common.cache_env("transformers", given.cache_dir), **common.SERVER_ENV}
    threads = given.settings.get("cpu_threads")
    if threads:
        # torch sizes its intra-op pool from OMP_NUM_THREADS (MKL's from MKL_NUM_THREADS);
        # unset, every server takes every core, and several on one machine oversubscribe it.
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
        notes.append(
            f"CPU threads per server: {threads} ({common.setting_variable('cpu_threads')}: "
            "OMP_NUM_THREADS, MKL_NUM_THREADS)"
        )
    env = common.merge_environment(env, given.environment)
    if facts.mtp_layers:
        notes.append(
            f"transformers serve ignores the model's MTP head (mtp_num_hidden_layers {facts.mtp_layers}):"
            " no speculative decoding in this profile"
        )
    if facts.hybrid:
        notes.append(
            f"hybrid model ({facts.linear_layers} of {len(facts.layer_types)} layers linear_attention): "
            "transformers runs the Gated-DeltaNet layers in torch (slow without flash-linear-attention)"
        )
    notes.append(
        f"entry point: transformers serve (transformers {given.engine_version}), pinned to the model "
        "directory (its positional argument, right after serve)"
    )
    argv = [f"{given.venv_dir.rstrip('/')}/bin/transformers", "serve", given.model_path, *flags.argv(added)]
    return {"argv": argv, "env": env, "notes": notes}
