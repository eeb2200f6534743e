"""Launch plan, SGLang part: the argv, environment and notes of ``sglang serve``.

:func:`plan_sglang` derives the flags from the settings and the model (the mamba scheduler of
hybrid models, the speculative trio), applies the overrides, the drafter's rules
(``launch_plan/draft.py``), the tensor-parallel and memory rules (``launch_plan/budget.py``, which
also sets ``--mem-fraction-static``, ``--max-running-requests`` and ``--context-length``) and, with
an API key, keeps the key out of SGLang's logs. Each refusal is one sentence naming the variable
to change (docs/launch-plan.md). Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deploytools.launch_plan import budget, common, draft, engines
from deploytools.launch_plan.model import ModelFacts

# `sglang serve` exists since 0.5.5; from 0.5.10 `python -m sglang.launch_server` warns.
SGLANG_SERVE_SINCE = (0, 5, 5)
# Algorithms that take --speculative-num-steps/--speculative-eagle-topk/--speculative-num-draft-tokens.
EAGLE_FAMILY = ("NEXTN", "EAGLE", "EAGLE3", "STANDALONE")
# SGLang's own choice (auto_choose_speculative_params) for Qwen3.5/3.6 and most models.
DEFAULT_SPECULATIVE = {"steps": 3, "topk": 1, "draft": budget.DEFAULT_DRAFT_TOKENS}
# GiB per GPU kept free beyond the weights by the quick fit rule that picks the tensor-parallel
# size; the memory budget (launch_plan/budget.py) then sizes SGLang's pools term by term.
# Override with inference_server_gpu_memory_headroom_gib.
DEFAULT_HEADROOM_GIB = 8.0


def _gpu_rules(
    flags: common.FlagSet,
    facts: ModelFacts,
    gpus: Sequence[Mapping[str, Any]] | None,
    weights_bytes: int | None,
    headroom_gib: float,
    notes: list[str],
) -> tuple[int, int] | None:
    """The tensor-parallel and memory-fit rules of budget.gpu_rules, for the model's heads."""
    heads = {"attention heads (num_attention_heads)": facts.attention_heads}
    if facts.hybrid:
        heads["linear-attention key heads (linear_num_key_heads)"] = facts.linear_key_heads
        heads["linear-attention value heads (linear_num_value_heads)"] = facts.linear_value_heads
    return budget.gpu_rules(flags, {k: v for k, v in heads.items() if v}, gpus, weights_bytes, headroom_gib, notes)


def _nextn_rule(flags: common.FlagSet, facts: ModelFacts, notes: list[str]) -> None:
    """NEXTN drafts with the model's own MTP head, so the model must have one."""
    if flags.get("--speculative-algorithm") == "NEXTN":
        if facts.mtp_layers < 1:
            raise common.PlanError(
                f"{flags.source('--speculative-algorithm')} is NEXTN, which drafts with the model's "
                f"own MTP head, but {facts.architecture} has mtp_num_hidden_layers "
                f"{facts.mtp_layers} in config.json: set {common.setting_variable('speculative_algorithm')} to null, "
                "or to EAGLE or DFLASH with a drafter in model_sync_draft_source."
            )
        notes.append(
            f"NEXTN drafts with the model's own MTP head (mtp_num_hidden_layers {facts.mtp_layers}); "
            "SGLang reports it as EAGLE"
        )


def _speculative_rules(flags: common.FlagSet, notes: list[str]) -> None:
    """Steps/topk/draft tokens go together; with topk 1, draft = steps + 1."""
    algo = flags.get("--speculative-algorithm")
    if algo is None:
        stray = [
            f
            for f in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
            if flags.has(f)
        ]
        if stray:
            raise common.PlanError(
                f"{flags.source(stray[0])} sets {stray[0]} without a speculative algorithm: "
                f"set {common.setting_variable('speculative_algorithm')} or remove it."
            )
        return
    if algo not in EAGLE_FAMILY:
        return
    trio = {
        "steps": "--speculative-num-steps",
        "topk": "--speculative-eagle-topk",
        "draft": "--speculative-num-draft-tokens",
    }
    present = {k: f for k, f in trio.items() if flags.has(f)}
    if present and len(present) < 3:
        missing = [f for k, f in trio.items() if k not in present]
        first = next(iter(present.values()))
        raise common.PlanError(
            f"{flags.source(first)} sets {first} without {' and '.join(missing)}: "
            "SGLang needs all three or none, so set all three (3, 1, 4 is SGLang's own choice) "
            "or none."
        )
    if not present:
        notes.append(
            f"speculative decoding {algo}: steps, top-k and draft tokens left to SGLang, which picks "
            "3/1/4 for most models"
        )
        return
    steps, topk, draft = (flags.number(trio[k]) for k in ("steps", "topk", "draft"))
    if topk == 1 and draft != steps + 1:
        raise common.PlanError(
            f"{flags.source(trio['draft'])} is {draft}, but with speculative_eagle_topk 1 SGLang "
            f"uses speculative_num_steps + 1 = {steps + 1} draft tokens: set it to {steps + 1}."
        )
    if topk is not None and topk > 1:
        notes.append(f"speculative_eagle_topk {topk} > 1: SGLang falls back to spec v1 (no overlap scheduler)")
    notes.append(
        f"speculative decoding {algo}: {steps} steps, top-k {topk}, {draft} draft tokens; SGLang "
        "sets --max-running-requests to 48 unless it is set"
    )


def _mamba_rules(
    flags: common.FlagSet,
    facts: ModelFacts,
    env: Mapping[str, str],
    notes: list[str],
    constants: Mapping[str, Any],
    version: engines.EngineVersion,
) -> None:
    """Hybrid + speculative decoding: extra_buffer with the radix cache, and its limits.

    Before 0.5.15 extra_buffer also needs SGLANG_ENABLE_SPEC_V2=1; from 0.5.17 the default strategy
    (auto) resolves to extra_buffer here (``version``). The strategy flag is named as the version names
    it (``--mamba-radix-cache-strategy`` from 0.5.15; FlagSet translates the plan's 0.5.11 name)."""
    algo = flags.get("--speculative-algorithm")
    strategy_flag = flags.table.current("--mamba-scheduler-strategy")
    spec_v2_env = "SGLANG_ENABLE_SPEC_V2" not in version.removed_environment
    with_env = " and SGLANG_ENABLE_SPEC_V2=1" if spec_v2_env else ""
    radix = not flags.has("--disable-radix-cache")
    overlap = not flags.has("--disable-overlap-schedule")
    auto = "extra_buffer" if version.auto_strategy_extra_buffer and radix and overlap else "auto"
    strategy = flags.get("--mamba-scheduler-strategy") or auto
    if not facts.hybrid:
        if flags.has("--mamba-scheduler-strategy"):
            notes.append(f"{strategy_flag} has no effect: {facts.architecture} has no linear-attention layers")
        return
    if strategy == "extra_buffer":
        if not radix:
            strategy_source = flags.source("--mamba-scheduler-strategy")
            todo = (
                f"set {common.setting_variable('disable_radix_cache')} to true instead, so the plan keeps no_buffer"
                if strategy_source.startswith("the plan")
                else "drop one of the two"
            )
            raise common.PlanError(
                f"{flags.source('--disable-radix-cache')} disables the radix cache, which SGLang "
                f"refuses together with {strategy_flag} extra_buffer, set by "
                f"{strategy_source}: {todo}."
            )
        interval = flags.number("--mamba-track-interval")
        interval_source = (
            flags.source("--mamba-track-interval") if interval is not None else "the default --mamba-track-interval"
        )
        if interval is None:
            interval = int(constants.get("mamba_track_interval_default", 256))
        draft = flags.number("--speculative-num-draft-tokens")
        if algo is not None and draft is not None and interval < draft:
            raise common.PlanError(
                f"{interval_source} is {interval}, less than the {draft} speculative draft tokens, "
                f"which SGLang refuses with extra_buffer: set it to at least {draft}."
            )
        page = flags.number("--page-size")
        if page is not None:
            chunk = int(constants.get("fla_chunk_size", 64))
            if max(chunk, page) % min(chunk, page):
                raise common.PlanError(
                    f"{flags.source('--page-size')} is {page}, but with extra_buffer the page size "
                    f"and SGLang's linear-attention chunk size {chunk} must divide one another: "
                    "use a power of two such as 16, 32, 64 or 128."
                )
            if interval % page:
                raise common.PlanError(
                    f"{interval_source} is {interval}, which is not divisible by --page-size {page} "
                    f"(set by {flags.source('--page-size')}): set {common.setting_variable('mamba_track_interval')} "
                    f"to a multiple of {page}."
                )
    if algo is None:
        return
    if strategy != "extra_buffer" and radix:
        given = flags.get("--mamba-scheduler-strategy")
        if given is not None:
            source = flags.source("--mamba-scheduler-strategy")
            todo = f"set {source} to extra_buffer" + (
                " or leave it unset so the plan derives it"
                if source == common.setting_variable("mamba_scheduler_strategy")
                else ""
            )
        elif strategy_flag in flags.removed:
            todo = f"remove {flags.removed[strategy_flag]}, which removes the extra_buffer the plan derived"
        else:
            todo = (
                f"set {common.setting_variable('speculative_algorithm')} rather than "
                "inference_server_overrides so the plan derives extra_buffer, or add "
                f"'{strategy_flag}: extra_buffer' to inference_server_overrides"
            )
        current = given or "no_buffer (the default auto)"
        raise common.PlanError(
            f"speculative decoding ({flags.source('--speculative-algorithm')}: {algo}) on the hybrid "
            f"model {facts.architecture} with the radix cache needs {strategy_flag} "
            f"extra_buffer{with_env}, not {current}, and SGLang refuses it at "
            f"start-up: {todo}, or set {common.setting_variable('disable_radix_cache')} to true."
        )
    if (
        spec_v2_env
        and strategy == "extra_buffer"
        and str(env.get("SGLANG_ENABLE_SPEC_V2", "")).lower() not in ("1", "true")
    ):
        raise common.PlanError(
            "inference_server_environment sets SGLANG_ENABLE_SPEC_V2 to "
            f"{env.get('SGLANG_ENABLE_SPEC_V2')!r}, but speculative decoding with extra_buffer on the "
            f"hybrid model {facts.architecture} needs it at 1: remove it from "
            "inference_server_environment."
        )
    if strategy == "extra_buffer":
        notes.append(
            f"hybrid model ({facts.linear_layers} of {len(facts.layer_types)} layers linear_attention) "
            f"+ speculative decoding + radix cache: {strategy_flag} extra_buffer{with_env} (5 mamba state "
            "slots per running request with the overlap scheduler: see the memory budget)"
        )
    else:
        notes.append(
            f"hybrid model + speculative decoding with the radix cache disabled "
            f"({strategy_flag} {strategy}): no prefix caching"
        )


def _sglang_flags(
    table: common.FlagTable,
    facts: ModelFacts,
    settings: Mapping[str, Any],
    model_path: str,
    host: str,
    port: int,
    notes: list[str],
) -> common.FlagSet:
    """Flags derived from the settings and the model, before overrides."""
    flags = common.FlagSet(table)
    flags.set("--model-path", model_path, "model_sync_model_dir")
    flags.set("--host", host, "inference_server_host")
    flags.set("--port", port, "inference_server_port")
    for spec in common.SETTINGS:
        flag = spec.flag.get("sglang")
        value = settings.get(spec.key)
        if flag is None or value is None or value is False:
            continue
        flags.set(flag, value, spec.variable)
        if spec.key == "speculative_algorithm":
            spec_keys = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
            if value in EAGLE_FAMILY and all(settings.get(k) is None for k in spec_keys):
                for key, default in zip(spec_keys, DEFAULT_SPECULATIVE.values(), strict=True):
                    flags.set(
                        common.SETTING_BY_KEY[key].flag["sglang"],
                        default,
                        f"the plan (default for {common.setting_variable(key)})",
                    )
                notes.append("speculative steps/top-k/draft tokens not set: the plan uses SGLang's own choice 3/1/4")
    speculative = settings.get("speculative_algorithm") is not None
    if (
        facts.hybrid
        and speculative
        and settings.get("mamba_scheduler_strategy") is None
        and not settings.get("disable_radix_cache")
    ):
        flags.set(
            "--mamba-scheduler-strategy",
            "extra_buffer",
            f"the plan (derived from {common.setting_variable('speculative_algorithm')})",
        )
    _settings_order(flags, [])
    return flags


def _settings_order(flags: common.FlagSet, added: Sequence[str]) -> None:
    """Put the plan's flags in common.SETTINGS order (the speculative trio and mamba flags after the
    algorithm); flags that overrides added keep their place after them."""
    order = [f for s in common.SETTINGS for f in [s.flag.get("sglang")] if f]
    head = ["--model-path", "--host", "--port"]
    ranked = head + [f for f in order if f not in head]
    flags.values = dict(
        sorted(
            flags.values.items(),
            key=lambda kv: ranked.index(kv[0]) if kv[0] in ranked and kv[0] not in added else len(ranked),
        )
    )


# SGLang only adds when it configures logging itself).
SGLANG_SILENT_LOGGERS = ("sglang.srt.entrypoints.engine", "httpx", "httpcore")


def sglang_logging_config(level: str) -> dict[str, Any]:
    """The dictConfig SGLang loads from SGLANG_LOGGING_CONFIG_PATH: its own format and level,
    without the logger that prints the server arguments."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"sglang": {"format": "[%(asctime)s] %(message)s", "datefmt": "%Y-%m-%d %H:%M:%S"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "sglang", "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {name: {"level": "WARNING"} for name in SGLANG_SILENT_LOGGERS},
    }


def _keep_key_out_of_logs(
    flags: common.FlagSet,
    env: dict[str, str],
    environment: Mapping[str, Any],
    logging_config_file: str | None,
    notes: list[str],
) -> dict[str, Any] | None:
    """With an API key: the logging configuration (returned) and its variable in ``env``."""
    if "SGLANG_LOGGING_CONFIG_PATH" in environment:
        notes.append(
            "SGLANG_LOGGING_CONFIG_PATH comes from inference_server_environment: that configuration "
            "must keep the logger sglang.srt.entrypoints.engine at WARNING, or SGLang logs the API key"
        )
        return None
    if not logging_config_file:
        notes.append("no logging_config_file: SGLang will log its arguments, the API key included, when it starts")
        return None
    level = common.argv_values(flags.values["--log-level"])[0] if flags.has("--log-level") else "info"
    env["SGLANG_LOGGING_CONFIG_PATH"] = logging_config_file
    notes.append(
        f"SGLang's start-up dump of its arguments (the API key included) is kept out of the journal: "
        f"{logging_config_file} (SGLANG_LOGGING_CONFIG_PATH) logs at {level} without the logger "
        "sglang.srt.entrypoints.engine"
    )
    return sglang_logging_config(level)


def plan_sglang(facts: ModelFacts, given: common.PlanInput) -> dict[str, Any]:
    """The SGLang plan: entry point, flags, environment, notes, the memory budget (``budget``, when
    the weights' size is known) and with an API key the logging configuration that keeps it out of
    the logs (``logging_config``)."""
    notes: list[str] = []
    flags = _sglang_flags(given.table, facts, given.settings, given.model_path, given.host, given.port, notes)
    added = common.apply_overrides(flags, given.overrides, common.PINNED)
    common.check_values(flags)
    draft.apply_draft(flags, notes=notes, error=common.PlanError, **(given.drafter or {}))
    speculative = flags.get("--speculative-algorithm") is not None
    version = engines.engine_version("sglang", given.engine_version)
    version.refuse_known_bad(hybrid=facts.hybrid, speculative=speculative, variable="ml_env_lock")
    notes.append(version.note())
    env = {**common.cache_env("sglang", given.cache_dir), **common.SERVER_ENV}
    if facts.hybrid and speculative and "SGLANG_ENABLE_SPEC_V2" not in version.removed_environment:
        env["SGLANG_ENABLE_SPEC_V2"] = "1"
    for name in version.removed_environment:
        if given.environment.get(name) is not None:
            notes.append(
                f"inference_server_environment sets {name}, which SGLang {given.engine_version} no longer reads: "
                "remove it"
            )
    env = common.merge_environment(env, given.environment)

    headroom = given.settings.get("gpu_memory_headroom_gib")
    sized = _gpu_rules(
        flags,
        facts,
        given.gpus,
        given.weights_bytes,
        DEFAULT_HEADROOM_GIB if headroom is None else float(headroom),
        notes,
    )
    context = flags.number("--context-length") if "--context-length" in flags.values else None
    if (
        context is not None
        and facts.max_positions
        and context > facts.max_positions
        and env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN") != "1"
    ):
        raise common.PlanError(
            f"{flags.source('--context-length')} is {context}, more than the model's "
            f"max_position_embeddings {facts.max_positions}: lower it (SGLang refuses it unless "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is in inference_server_environment)."
        )
    _nextn_rule(flags, facts, notes)
    _mamba_rules(flags, facts, env, notes, given.table.constants, version)
    _speculative_rules(flags, notes)
    memory = None
    if sized is not None:  # the budget sets --mem-fraction-static, --max-running-requests, --context-length
        memory = budget.plan_memory(
            flags,
            given.model_config,
            tp=sized[0],
            gpu_mib=sized[1],
            weights_bytes=given.weights_bytes,
            settings=given.settings,
            env=env,
            notes=notes,
            rules=version.budget_rules,
        )
        _settings_order(flags, added)

    venv = given.venv_dir.rstrip("/")
    if common.version_tuple(given.engine_version) >= SGLANG_SERVE_SINCE:
        entry = [f"{venv}/bin/sglang", "serve"]
        notes.append(f"entry point: sglang serve (SGLang {given.engine_version} >= 0.5.5)")
    else:
        entry = [f"{venv}/bin/python", "-m", "sglang.launch_server"]
        notes.append(
            f"entry point: python -m sglang.launch_server (SGLang {given.engine_version} has no `sglang serve`)"
        )
    argv = [*entry, *flags.argv(added)]
    plan: dict[str, Any] = {"argv": argv, "env": env, "notes": notes}
    if memory is not None:
        plan["budget"] = memory
    if given.api_key_file:
        argv.extend([common.CONFIG_FLAG, given.api_key_file])
        notes.append(
            f"API key (inference_server_api_key) read by SGLang from {given.api_key_file} ({common.CONFIG_FLAG}), "
            "so it is in neither the unit file nor the argv; /health and /metrics stay open, /v1/* needs the key"
        )
        logging_config = _keep_key_out_of_logs(flags, env, given.environment, given.logging_config_file, notes)
        if logging_config is not None:
            plan["env"] = dict(sorted(env.items()))
            plan["logging_config"] = logging_config
    return plan
