"""Memory budget per GPU of an SGLang launch, by the SGLang version's own rules (0.5.11's or 0.5.17's).

SGLang sizes its pools once, at start-up, from what is left of the GPU after the weights:
``--mem-fraction-static`` of the memory available before the weights load holds the
weights, the mamba (linear-attention) state slots, the speculative verify buffers and the
KV cache; the rest is left for activations, CUDA graphs and the speculative draft model,
which 0.5.11 loads afterwards (0.5.17 before the pools, inside the static part) and which gets
a KV pool of the same token count. When the static part cannot hold the verify buffers and a
KV cache, SGLang 0.5.11 stops with ``RuntimeError: Not enough memory. Please try to increase
--mem-fraction-static.``; 0.5.17 starts with its running requests capped to what its mamba
slots hold, and stops only when they hold none (``RuntimeError: Not enough GPU memory for
hybrid (mamba/linear-attention) state cache``). When the rest cannot hold the draft, it stops
with a CUDA out-of-memory error. This module computes all of that offline, from the model's
``config.json``, the GPU size, the tensor-parallel size and the weights' size, so the launch
plan can set ``--mem-fraction-static``, ``--max-running-requests`` and ``--context-length``
itself, refuse a launch that cannot start or runs fewer requests than the target, and say
loudly when 0.5.17 will cap what was asked. Each rule names the SGLang function it follows
(docs/launch-plan.md, "Memory budget"); ``budget_rules`` in engines.json says
which version's rules a version follows.

The budget is in three parts: the model's shapes (launch_plan/shapes.py), the budget's
arithmetic and searches (launch_plan/pools.py) and, here, the plan's side: the rules that pick
the tensor-parallel size, the launch read from the flags, the choices, the refusals and the
notes. Every name of the other two parts is importable from here, as callers use it
(``budget.geometry``, ``budget.compute_budget``, ``budget.PlanError``...).

Pure functions, standard library only. ``PlanError`` (launch_plan/pools.py) is one class for
every part. The Ansible filter ``memory_budget`` returns :meth:`Budget.as_dict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from deploytools.launch_plan.common import setting_variable

# The model's shapes and the budget's arithmetic, importable from here as callers use them.
from deploytools.launch_plan.pools import (  # noqa: F401
    BEFORE_POOLS_0517_GIB,
    CONTEXT_STEP,
    CUDA_CONTEXT_0517_GIB,
    CUDA_CONTEXT_GIB,
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_MIN_CONTEXT_LENGTH,
    GIB,
    MAMBA_EXTRA_BUFFER_NO_OVERLAP,
    MAMBA_EXTRA_BUFFER_OVERLAP,
    MAMBA_FULL_MEMORY_RATIO,
    MAMBA_SLOTS_PER_REQUEST,
    MIB,
    RULES,
    SPECULATIVE_MAX_RUNNING,
    Budget,
    Launch,
    PlanError,
    Rules,
    acceptable,
    activation_reserve_mib,
    budget_rules,
    compute_budget,
    default_mem_fraction,
    fraction_bounds,
    largest_running,
    mamba_pool,
    memory_tier,
    piecewise_graph_count,
    slots_per_request,
    vlm_factor,
)
from deploytools.launch_plan.shapes import (  # noqa: F401
    DTYPE_BYTES,
    Geometry,
    embedding_bytes,
    geometry,
    kv_bytes_per_token,
    mamba_state_bytes,
    mtp_weight_bytes,
    rotary_cache_bytes,
    text_config,
)

# --------------------------------------------------------------------------------------
# The plan's side: read the flags, choose, refuse, explain
# --------------------------------------------------------------------------------------


class Flags(Protocol):
    """What the budget reads from launch_plan.FlagSet."""

    values: dict[str, Any]

    def get(self, flag: str) -> Any: ...
    def has(self, flag: str) -> bool: ...
    def source(self, flag: str) -> str: ...
    def number(self, flag: str, kind: Callable[[Any], Any] = int, value: Any = None) -> Any: ...
    def set(self, flag: str, value: Any, source: str) -> None: ...


def gib(value: float) -> str:
    """GiB with one decimal, as the plan's sentences write them."""
    return f"{value:.1f} GiB"


def gpu_rules(
    flags: Flags,
    counts: Mapping[str, int],
    gpus: Sequence[Mapping[str, Any]] | None,
    weights_bytes: int | None,
    headroom_gib: float,
    notes: list[str],
) -> tuple[int, int] | None:
    """Tensor parallelism must divide the model's head ``counts`` ({what: count}), fit the GPUs
    found and their memory (:func:`check_weights_fit`); returns the tensor-parallel size and the
    smallest GPU's MiB for the budget (None when the weights' size is unknown)."""
    tp_flag = "--tensor-parallel-size"
    tp = flags.number(tp_flag)
    tp_source = flags.source(tp_flag) if flags.has(tp_flag) else setting_variable("tensor_parallel_size")
    if tp is None:
        tp = 1
    elif tp < 1:
        raise PlanError(f"{tp_source} is {tp}: set it to 1 or more.")
    if gpus is None:
        raise PlanError(
            "preflight_gpus is undefined: run the preflight role first "
            "(or give offline_plan.gpus in host_vars for an offline plan)."
        )
    if not gpus:
        raise PlanError(
            "preflight_gpus is empty (no NVIDIA GPU found on the host), but the sglang engine "
            "needs GPUs: fix the driver or put the host in the rehearsal group."
        )
    choices = [n for n in range(1, len(gpus) + 1) if all(count % n == 0 for count in counts.values())]
    if tp > len(gpus):
        raise PlanError(f"{tp_source} is {tp}, but the host has {len(gpus)} GPU(s): set it to {_or_list(choices)}.")
    for what, count in counts.items():
        if count % tp:
            raise PlanError(
                f"{tp_source} is {tp}, which does not divide the model's {count} {what}: set it to {_or_list(choices)}."
            )
    gpu_mem = min(int(g.get("memory_mib") or 0) * MIB for g in gpus[:tp])
    names = sorted({str(g.get("name", "GPU")) for g in gpus[:tp]})
    if weights_bytes is None:
        notes.append(
            "weights size unknown (model_sync_weights_bytes): the memory-fit rule and the memory budget "
            "were not checked"
        )
        return None
    fit = check_weights_fit(flags, tp, tp_source, choices, gpu_mem, weights_bytes, headroom_gib)
    divided = ", ".join(f"{count} {what.split(' (')[0]}" for what, count in counts.items())
    notes.append(
        f"tensor parallel {tp} of {len(gpus)} GPU(s) ({', '.join(names)}, {gib(gpu_mem / GIB)} each): "
        f"divides {divided}; {fit}"
    )
    return tp, gpu_mem // MIB


def _or_list(items: Sequence[int]) -> str:
    """'1, 2 or 4' for the sizes a refusal offers."""
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def check_weights_fit(
    flags: Flags, tp: int, tp_source: str, choices: Sequence[int], gpu_mem: int, weights_bytes: int, headroom_gib: float
) -> str:
    """The quick rule before the budget: the weights per GPU plus the headroom fit the smallest GPU,
    and inside an explicit --mem-fraction-static; returns the note, or refuses naming the TP that fits."""
    per_gpu = weights_bytes / tp
    headroom = headroom_gib * GIB

    def fits(size: int) -> bool:
        return weights_bytes / size + headroom <= gpu_mem

    if not fits(tp):
        bigger = [n for n in choices if n > tp and fits(n)]
        todo = (
            f"set it to {bigger[0]}"
            if bigger
            else "no tensor-parallel size over the GPUs found fits, so serve a smaller or quantized model or add GPUs"
        )
        raise PlanError(
            f"{tp_source} is {tp}, but the weights need {gib(per_gpu / GIB)} per GPU plus "
            f"{gib(headroom / GIB)} headroom ({setting_variable('gpu_memory_headroom_gib')}) "
            f"and each GPU has {gib(gpu_mem / GIB)}: {todo}."
        )
    frac = flags.number("--mem-fraction-static", float)
    if frac is not None and per_gpu >= frac * gpu_mem:
        raise PlanError(
            f"{flags.source('--mem-fraction-static')} is {frac}, but the weights alone take "
            f"{gib(per_gpu / GIB)} of the {gib(frac * gpu_mem / GIB)} it reserves per GPU: raise it or "
            "the tensor-parallel size."
        )
    return f"weights {gib(per_gpu / GIB)} per GPU + {gib(headroom / GIB)} headroom fit"


def launch_from_flags(
    flags: Flags, env: Mapping[str, str], tp: int, gpu_mib: int, weights_bytes: int, rules: str = "0.5.11"
) -> Launch:
    """The :class:`Launch` an argv describes (flags SGLang would read; the rest at its defaults),
    sized by the budget rules ``rules`` (``budget_rules`` of the engine version)."""

    def num(flag: str, kind: Callable[[Any], Any] = int) -> Any:
        return flags.number(flag, kind) if flags.has(flag) else None

    algo = flags.get("--speculative-algorithm")
    topk = num("--speculative-eagle-topk") or 1
    spec_v2 = str(env.get("SGLANG_ENABLE_SPEC_V2", "1")).lower() in ("1", "true")
    overlap = not flags.has("--disable-overlap-schedule") and (
        algo is None or (algo in ("NEXTN", "EAGLE", "EAGLE3", "STANDALONE") and spec_v2 and topk == 1)
    )
    kv_dtype = str(flags.get("--kv-cache-dtype") or "auto")
    model_dtype = str(flags.get("--dtype") or "bfloat16")
    return Launch(
        gpu_memory_mib=gpu_mib,
        tp=tp,
        weights_bytes=weights_bytes,
        mem_fraction_static=num("--mem-fraction-static", float),
        max_running_requests=num("--max-running-requests"),
        context_length=num("--context-length"),
        speculative_algorithm=algo,
        draft_tokens=num("--speculative-num-draft-tokens"),
        extra_buffer=flags.get("--mamba-scheduler-strategy") == "extra_buffer",
        radix_cache=not flags.has("--disable-radix-cache"),
        overlap=overlap,
        page_size=num("--page-size") or 1,
        chunked_prefill_size=num("--chunked-prefill-size"),
        cuda_graph_max_bs=num("--cuda-graph-max-bs"),
        piecewise_cuda_graph=not flags.has("--disable-piecewise-cuda-graph"),
        max_mamba_cache_size=num("--max-mamba-cache-size"),
        max_total_tokens=num("--max-total-tokens"),
        mamba_full_memory_ratio=num("--mamba-full-memory-ratio", float) or MAMBA_FULL_MEMORY_RATIO,
        kv_bytes=DTYPE_BYTES.get(model_dtype if kv_dtype == "auto" else kv_dtype, 2),
        conv_bytes=DTYPE_BYTES.get(str(env.get("SGLANG_MAMBA_CONV_DTYPE") or "bfloat16"), 2),
        ssm_bytes=DTYPE_BYTES.get(str(env["SGLANG_MAMBA_SSM_DTYPE"])) if env.get("SGLANG_MAMBA_SSM_DTYPE") else None,
        rules=rules,
    )


def plan_memory(
    flags: Flags,
    config: Mapping[str, Any],
    *,
    tp: int,
    gpu_mib: int,
    weights_bytes: int,
    settings: Mapping[str, Any],
    env: Mapping[str, str],
    notes: list[str],
    rules: str = "0.5.11",
) -> dict[str, Any]:
    """Set --mem-fraction-static, --max-running-requests and (when the KV cache cannot hold the
    model's context) --context-length from the budget, refuse what cannot start or leaves less than
    the settings' minimums, add the budget's table to ``notes`` and return it for plan["budget"].

    ``rules`` names the SGLang version's budget rules (``EngineVersion.budget_rules``): with 0.5.17's,
    a launch SGLang starts with fewer running requests than asked is kept with a loud note, and refused
    like any other budget when that leaves fewer than ``target_concurrency``."""
    geo = geometry(config)
    launch = launch_from_flags(flags, env, tp, gpu_mib, weights_bytes, rules)
    target = settings.get("target_concurrency")
    min_context = settings.get("min_context_length") or DEFAULT_MIN_CONTEXT_LENGTH
    min_source = (
        setting_variable("min_context_length")
        if settings.get("min_context_length")
        else "the plan's default min_context_length"
    )
    if launch.mem_fraction_static is None:
        chosen = round(compute_budget(geo, launch).default_mem_fraction_static, 3)
        flags.set("--mem-fraction-static", chosen, "the plan: SGLang's own default for this GPU")
        launch = dataclasses.replace(launch, mem_fraction_static=chosen)
    if launch.max_running_requests is None and "--max-running-requests" not in getattr(flags, "removed", {}):
        running = target
        source = f"the plan: {setting_variable('target_concurrency')}"
        if running is None and launch.speculative_algorithm is not None:
            running = largest_running(geo, launch, min_context) or largest_running(geo, launch, 1) or None
            source = "the plan: the most running requests the budget holds"
        if running is not None:
            flags.set("--max-running-requests", running, source)
            launch = dataclasses.replace(launch, max_running_requests=running)
    budget = compute_budget(geo, launch)
    _refuse(flags, geo, launch, budget, target, min_context, min_source)
    if launch.context_length is None and geo.max_positions and budget.kv_tokens < geo.max_positions:
        context = max(budget.kv_tokens // CONTEXT_STEP * CONTEXT_STEP, min(budget.kv_tokens, CONTEXT_STEP))
        flags.set("--context-length", context, "the plan: the longest context the KV cache holds")
        budget = compute_budget(geo, dataclasses.replace(launch, context_length=context))
    notes.extend(budget_notes(budget, flags, geo))
    return budget.as_dict()


def _refuse(
    flags: Flags, geo: Geometry, launch: Launch, budget: Budget, target: int | None, min_context: int, min_source: str
) -> None:
    """Refuse, with one sentence naming the numbers and what to change, a budget that cannot start
    SGLang, that leaves the draft no room, or that leaves less than the settings' minimums."""
    frac = f"--mem-fraction-static {budget.mem_fraction_static} ({flags.source('--mem-fraction-static')})"
    running_src = (
        flags.source("--max-running-requests")
        if flags.has("--max-running-requests")
        else "SGLang's default for speculative decoding"
    )
    running = f"--max-running-requests {budget.requested_running} ({running_src})"

    def todo(running_key: str) -> str:
        """What to change: fewer running requests (when some fit) or a larger fraction (when one does)."""
        best = largest_running(geo, launch, min_context)
        bounds = fraction_bounds(geo, launch, target or 1, min_context)
        options = [f"lower {running_key} to {best}"] if best else []
        options.append(
            f"raise {fraction_variable(flags)} to at least {bounds[0]}"
            if bounds
            else f"raise {setting_variable('tensor_parallel_size')} or use GPUs with more memory"
        )
        return " or ".join(options)

    rules = budget_rules(budget.rules)

    key = (
        setting_variable("target_concurrency")
        if running_src.startswith("the plan")
        else running_src
        if flags.has("--max-running-requests")
        else setting_variable("max_running_requests")
    )
    if not budget.starts and rules.draft_first:
        raise PlanError(_cannot_start_loaded_first(budget, geo, frac, running, todo(key)))
    if not budget.starts:
        left = budget.static_gib - budget.weights_gib
        raise PlanError(
            f"the memory budget per GPU cannot start SGLang: with {frac} and {running}, the weights "
            f"({gib(budget.weights_gib)}) leave {gib(left)} of the "
            f"{gib(budget.static_gib)} static pools, and the speculative verify buffers for "
            f"{budget.requested_running} requests ({gib(budget.verify_reserved_gib)}) leave "
            f"{'no room for the KV cache' if budget.kv_tokens <= 0 else 'no mamba slot for one request'} "
            f"(SGLang stops with 'RuntimeError: Not enough memory'): {todo(key)}."
        )
    if not budget.outside_fits:
        top = fraction_bounds(geo, launch, None, 1)
        fraction = fraction_variable(flags)
        change = (
            f"lower {fraction} to at most {top[1]}"
            if top
            else f"lower {fraction} or raise {setting_variable('tensor_parallel_size')}"
        )
        draft = (
            f"the MTP draft's KV cache ({gib(budget.draft_kv_gib)})"
            if rules.draft_first
            else f"the MTP draft ({gib(budget.draft_weights_load_gib)} while it loads), its KV cache "
            f"({gib(budget.draft_kv_gib)})"
        )
        raise PlanError(
            f"{frac} leaves {gib(budget.free_after_pools_gib)} per GPU beside SGLang's "
            f"pools, but {draft} and SGLang's activation and CUDA-graph estimate "
            f"({gib(budget.activations_gib)}) need {gib(budget.outside_need_gib)}: {change}."
        )
    if target is not None and budget.max_running < target and capped_by_mamba(budget):
        raise PlanError(
            f"{setting_variable('target_concurrency')} is {target}, but the memory budget per GPU "
            f"({frac}, {running}) holds only {budget.max_running} running "
            f"requests ({budget.mamba_slots} mamba slots at {budget.slots_per_request} per request), to which "
            f"SGLang {rules.name} would cap them at start-up instead of refusing to start: "
            f"{todo(setting_variable('target_concurrency'))}."
        )
    if target is not None and budget.max_running < target:
        raise PlanError(
            f"{setting_variable('target_concurrency')} is {target}, but the memory budget per GPU "
            f"({frac}, {running}) holds only {budget.max_running} running "
            f"requests ({budget.mamba_slots} mamba slots at {budget.slots_per_request} per request): "
            f"{todo(setting_variable('target_concurrency'))}."
        )
    explicit_context = launch.context_length is not None
    if explicit_context and launch.context_length > budget.kv_tokens:
        raise PlanError(
            f"{flags.source('--context-length')} is {launch.context_length}, but the memory budget's KV cache "
            f"holds {budget.kv_tokens} tokens per GPU, so SGLang would cut every request at "
            f"{budget.kv_tokens - 1}: lower it to at most {budget.kv_tokens // CONTEXT_STEP * CONTEXT_STEP} "
            "or leave it unset so the plan sets it."
        )
    if explicit_context and launch.context_length < min_context:
        raise PlanError(
            f"{flags.source('--context-length')} is {launch.context_length}, less than {min_source} "
            f"{min_context}: raise it or lower {setting_variable('min_context_length')}."
        )
    if budget.kv_tokens < min_context:
        raise PlanError(
            f"the memory budget per GPU ({frac}, {running}) leaves a KV cache of {budget.kv_tokens} tokens, less "
            f"than {min_source} {min_context}: {todo(key)} or lower {setting_variable('min_context_length')}."
        )


def fraction_variable(flags: Flags) -> str:
    """The variable that sets --mem-fraction-static, as a refusal names it (the setting's variable when
    the plan chose the fraction itself)."""
    source = flags.source("--mem-fraction-static")
    return source if source.startswith("inference_server_") else setting_variable("mem_fraction_static")


def capped_by_mamba(budget: Budget) -> bool:
    """SGLang caps the running requests asked to what its mamba slots hold at start-up, and says so
    (0.5.17's kv_cache_configurator.py ``resolve_max_num_reqs``: "max_running_requests is capped to N
    by the mamba state cache"); False for rules that refuse or cap silently (0.5.11)."""
    asked = budget.requested_running
    return (
        budget_rules(budget.rules).caps_running
        and asked is not None
        and budget.mamba_slots > 0
        and budget.mamba_cap < min(asked, budget.kv_tokens // 2)
    )


def _cannot_start_loaded_first(budget: Budget, geo: Geometry, frac: str, running: str, todo: str) -> str:
    """The refusal of a budget that does not start SGLang when the draft loads before the pools
    (0.5.17), with SGLang's own error in the order it checks: no mamba slot
    (kv_cache_configurator.py ``_handle_max_mamba_cache``), no KV cache (``_profile_available_bytes``),
    no running request (``resolve_max_num_reqs``)."""
    loaded = f"the weights ({gib(budget.weights_gib)})"
    if budget.draft_weights_load_gib:
        loaded = (
            f"the target's weights ({gib(budget.weights_gib)}) and the MTP draft's "
            f"({gib(budget.draft_weights_load_gib)}), which SGLang {budget.rules} loads before it sizes its pools,"
        )
    taken = budget.weights_gib + budget.before_pools_gib
    if geo.hybrid and budget.mamba_slots <= 0:
        what = "leave no mamba state slot"
        error = "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache"
    elif budget.kv_tokens <= 0:
        what = "leave no room for the KV cache"
        error = "ValueError: Loaded weights leave no GPU memory for the KV cache"
    else:
        what = (
            f"leave {budget.mamba_slots} mamba state slots, fewer than the {budget.slots_per_request} one "
            "running request needs"
        )
        error = "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests"
    return (
        f"the memory budget per GPU cannot start SGLang {budget.rules}: with {frac} and {running}, {loaded} "
        f"take {gib(taken)} of the {gib(budget.static_gib)} static pools and {what} (SGLang stops with "
        f"'{error}'): {todo}."
    )


def budget_notes(budget: Budget, flags: Flags, geo: Geometry) -> list[str]:
    """The budget as a table, one note per row, then what SGLang will do differently from what was asked."""
    rules = budget_rules(budget.rules)
    mib = budget.mamba_per_request_gib * 1024
    per_verify = budget.mamba_per_request_gib * budget.draft_tokens
    verify_for = round(budget.verify_reserved_gib / per_verify) if per_verify else 0
    verify = (
        f"verify buffers (capped running + 1 = {verify_for} requests x {budget.draft_tokens} x {mib:.1f} MiB)"
        if rules.joint_mamba_solve
        else (
            f"verify buffers reserved ({budget.requested_running or 0} requests x {budget.draft_tokens} draft tokens "
            f"x {mib:.1f} MiB)"
        )
    )
    rows = [
        ("GPU memory (nvidia-smi) x tensor parallel", f"{gib(budget.gpu_gib)} x {budget.tp}"),
        (f"available before the weights (- {rules.cuda_context_gib} GiB CUDA context)", gib(budget.available_gib)),
        (
            f"--mem-fraction-static (SGLang {rules.name}'s default here {budget.default_mem_fraction_static:.3f})",
            f"{budget.mem_fraction_static:.3f} = {gib(budget.static_gib)} static pools",
        ),
        ("target weights (without the MTP head; + rotary cache)", gib(budget.weights_gib)),
    ]
    if rules.draft_first:
        rows.append(
            (
                f"loaded before the pools: MTP draft {gib(budget.draft_weights_load_gib)} + "
                f"{rules.before_pools_gib:.2f} GiB",
                gib(budget.before_pools_gib),
            )
        )
    rows += [
        (verify, gib(budget.verify_reserved_gib)),
        (
            f"mamba state slots ({mib:.1f} MiB each: conv {budget.mamba_conv_bytes / MIB:.1f} + SSM "
            f"{budget.mamba_ssm_bytes / MIB:.1f} MiB)",
            f"{budget.mamba_slots} slots = {gib(budget.mamba_gib)}",
        ),
        (
            f"KV cache ({budget.kv_bytes_per_token / 1024:g} KiB per token, {geo.full_layers} layers)",
            f"{budget.kv_tokens} tokens = {gib(budget.kv_gib)}",
        ),
        (
            f"running requests ({budget.mamba_slots} slots / {budget.slots_per_request} per request; "
            f"asked {budget.requested_running})",
            str(budget.max_running),
        ),
        (
            f"context length (model {geo.max_positions})",
            f"{budget.context_length}; longest request {budget.longest_request} tokens",
        ),
        (
            "beside the pools: draft KV + activations"
            if rules.draft_first
            else "beside the pools: draft load + draft KV + activations",
            f"{gib(budget.outside_need_gib)} of {gib(budget.free_after_pools_gib)} free",
        ),
    ]
    out = [
        f'memory budget per GPU by SGLang {rules.name}\'s rules (docs/launch-plan.md, "Memory budget"), '
        "one row per term:"
    ]
    out += [f"budget | {label:<74} | {value}" for label, value in rows]
    if capped_by_mamba(budget):
        out.append(
            f"WARNING: SGLang {rules.name} will cap --max-running-requests {budget.requested_running} "
            f"({flags.source('--max-running-requests')}) to {budget.max_running} at start-up instead of refusing "
            f"to start: its mamba state cache holds {budget.mamba_slots} slots at {budget.slots_per_request} per "
            f"request (it logs 'max_running_requests is capped to {budget.mamba_cap} by the mamba state cache'); "
            f"raise {fraction_variable(flags)} or lower --max-running-requests to run what is asked"
        )
    elif budget.requested_running is not None and budget.max_running < budget.requested_running:
        out.append(
            f"SGLang will run at most {budget.max_running} of the {budget.requested_running} requests asked "
            f"({flags.source('--max-running-requests')}): its "
            f"{'KV cache (tokens / 2)' if budget.max_running < budget.mamba_cap else 'mamba slots'} allow no more"
        )
    if not budget.draft_modelled:
        out.append(
            f"the {flags.get('--speculative-algorithm')} draft model's own memory is not in the budget "
            "(only NEXTN's MTP head is modelled)"
        )
    return out
