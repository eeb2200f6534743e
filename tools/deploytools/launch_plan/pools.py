"""Memory budget, arithmetic part: SGLang's pools per GPU for one launch, by 0.5.11's or 0.5.17's rules.

SGLang sizes its pools once, at start-up, from what is left of the GPU after the weights:
``--mem-fraction-static`` of the memory available before the weights load holds the
weights, the mamba (linear-attention) state slots, the speculative verify buffers and the
KV cache; the rest is left for activations, CUDA graphs and the speculative draft model's KV
pool (of the same token count). SGLang 0.5.11 loads the draft after its pools, from the rest;
0.5.17 loads it first, inside the static part, solves the mamba slots and the verify buffers
together and caps the running requests to its mamba slots instead of refusing (:class:`Rules`;
which rules a version follows is ``budget_rules`` in engines.json). This part holds
SGLang's defaults (its own ``--mem-fraction-static``), the launch knobs (:class:`Launch`), the
budget (:func:`compute_budget`, :class:`Budget`) and the searches over it; the model's shapes
are launch_plan/shapes.py, the plan's choices and refusals launch_plan/budget.py (which
re-exports these names). Each rule names the SGLang function it follows, 0.5.11's unless it
says 0.5.17 (docs/launch-plan.md, "Memory budget").

Pure functions and frozen dataclasses, standard library only; every refusal is
:class:`deploytools.launch_plan.errors.PlanError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploytools.launch_plan import shapes
from deploytools.launch_plan.errors import PlanError  # noqa: F401  (budget re-exports it)

GIB = 1024**3
MIB = 1024**2

# Memory the CUDA context, NCCL and torch take before the weights load, per GPU. Measured
# with SGLang 0.5.11 on one H200 (bench/realsize; figures in
# tests/launch_plan/fixtures/sglang_realsize_h200_logged.json): nvidia-smi's
# 143771 MiB are 140.40 GiB, and SGLang logged 88.07 GiB available after 51.05 GiB of weights,
# so 139.12 GiB were available before them (get_available_gpu_memory in
# ModelRunner.init_torch_distributed). Not measured at TP 2 (NCCL may take more there).
CUDA_CONTEXT_GIB = 1.28
# SGLang's defaults (server_args.py, ServerArgs fields).
MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio
SPECULATIVE_MAX_RUNNING = 48  # _handle_speculative_decoding: max_running_requests if unset
DEFAULT_DRAFT_TOKENS = 4  # auto_choose_speculative_params for Qwen3.5/3.6: 3/1/4
# model_runner_kv_cache_mixin.py: mamba slots per running request.
MAMBA_SLOTS_PER_REQUEST = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
MAMBA_EXTRA_BUFFER_OVERLAP = 2  # MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP (ping-pong buffers)
MAMBA_EXTRA_BUFFER_NO_OVERLAP = 1  # MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP
# SGLang 0.5.17 on the same H200 (bench/results/realsize-0.5.17.json; figures in
# tests/launch_plan/fixtures/sglang_0517_realsize_h200_logged.json) logged "Load weight begin.
# avail mem=137.58 GB": 2.82 GiB gone before the weights, 1.54 GiB more than 0.5.11. The tokenizer
# worker of a multimodal model reserves a CUDA IPC pool for multimodal features on GPU 0 first
# (server_args.py ``_handle_multimodal_feature_transport`` logs "reserving up to 1024 MiB",
# SGLANG_MM_FEATURE_CACHE_MB; multimodal/processors/base_processor.py ``MmItemMemoryPool``),
# beside that process's own CUDA context. Kept for every model (a text-only one was not measured:
# the budget stays on the safe side).
CUDA_CONTEXT_0517_GIB = 2.82
# SGLang 0.5.17 also takes 0.10 GiB between the weights and the pools' sizing, beside the draft's
# 5.53 GiB: 0.04 GiB between the target's "Load weight end" (86.53 GB) and the draft's
# "Load weight begin" (86.49 GB), 0.06 GiB between the draft's "Load weight end" (80.96 GB) and
# what ``_profile_available_bytes`` saw (80.90 GB: total_rest_memory=-0.27 GB at
# --mem-fraction-static 0.41, squeezed_0.41_48, is 80.90 - 0.59 x 137.58).
BEFORE_POOLS_0517_GIB = 0.10
# What the plan leaves as the longest context when inference_server_min_context_length
# is unset, and the granularity of the --context-length it sets.
DEFAULT_MIN_CONTEXT_LENGTH = 32768
CONTEXT_STEP = 1024


@dataclass(frozen=True)
class Rules:
    """How one SGLang version sizes its pools, where the versions differ (``budget_rules`` in
    engines.json names the set a version follows; :data:`RULES` holds them)."""

    name: str
    cuda_context_gib: float  # taken before the weights load (model_runner.py ``init_torch_distributed``)
    draft_first: bool  # the draft's weights load before the pools are sized, inside the static part
    before_pools_gib: float  # taken between the weights and the pools' sizing, beside the draft
    joint_mamba_solve: bool  # mamba slots and verify buffers solved together (0.5.17 ``_handle_max_mamba_cache``)
    caps_running: bool  # running requests capped to the mamba slots at start-up, never refused while one fits
    # The default --mem-fraction-static (server_args.py ``_handle_gpu_memory_settings``): 0.5.11 reserves
    # 4 GiB more for an EAGLE-family draft and captures no prefill graphs for a vision model; 0.5.17
    # reserves nothing for the draft (it loads inside the static part) and counts the prefill graphs always.
    default_draft_reserve: bool = True
    prefill_graphs_with_vision: bool = False


RULES = {
    # model_runner_kv_cache_mixin.py ``handle_max_mamba_cache`` (verify buffers for the requested running
    # requests reserved first), ``_resolve_max_num_reqs``; the draft loads after the pools
    # (speculative/eagle_worker_v2.py).
    "0.5.11": Rules("0.5.11", CUDA_CONTEXT_GIB, False, 0.0, False, False),
    # mem_cache/kv_cache_configurator.py ``_profile_available_bytes`` (the free memory after the target
    # and the draft have loaded), ``_handle_max_mamba_cache`` (joint solve, verify for the capped count +
    # 1), ``resolve_max_num_reqs`` (capped to max_mamba_cache_size // slots per request, with a warning).
    "0.5.17": Rules("0.5.17", CUDA_CONTEXT_0517_GIB, True, BEFORE_POOLS_0517_GIB, True, True, False, True),
}


def budget_rules(name: str) -> Rules:
    """The :class:`Rules` called ``name``, or a refusal naming the facts file's field."""
    try:
        return RULES[name]
    except KeyError:
        raise PlanError(
            f"budget_rules {name!r} is not a set of memory-budget rules the plan knows ({', '.join(RULES)}): "
            "fix it in tools/deploytools/launch_plan/engines.json."
        ) from None


# --------------------------------------------------------------------------------------
# SGLang's default --mem-fraction-static
# --------------------------------------------------------------------------------------


def memory_tier(gpu_mib: float, tp: int) -> tuple[int, int]:
    """server_args.py ``_handle_gpu_memory_settings``: (chunked_prefill_size, cuda_graph_max_bs)
    SGLang picks for the GPU's memory in MiB."""
    if gpu_mib < 20 * 1024:
        return 2048, 8
    if gpu_mib < 35 * 1024:
        return 2048, 24 if tp < 4 else 80
    if gpu_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def piecewise_graph_count(max_tokens: int) -> int:
    """server_args.py ``_generate_piecewise_cuda_graph_tokens``: how many token counts are captured."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return sum(1 for s in sizes if s <= max_tokens)


def activation_reserve_mib(gpu_mib: float, tp: int, chunked: int, graph_bs: int, piecewise: bool) -> float:
    """server_args.py ``_handle_gpu_memory_settings``: SGLang's estimate (MiB) of activations and
    CUDA graphs outside the static pools: 512 + chunked prefill x 1.5 + CUDA-graph batch x 2
    + tp / 8 GiB, + 8 MiB per piecewise CUDA graph."""
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if piecewise:
        reserved += piecewise_graph_count(chunked) * 8
    return reserved


def vlm_factor(vision: Mapping[str, Any] | None) -> float:
    """server_args.py ``adjust_mem_fraction_for_vlm``: 0.95 x (1 - 0.1 x (ViT size / ViT-L - 1)),
    clamped to [0.8, 1.05]; ViT size = ``num_hidden_layers`` (24 when the vision config has none,
    as Qwen3.5's, which names it ``depth``) x ``hidden_size`` squared."""
    if vision is None:
        return 1.0
    layers = vision.get("num_hidden_layers", 24)
    hidden = vision.get("hidden_size", 1024)
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def default_mem_fraction(
    gpu_mib: float,
    tp: int,
    geo: shapes.Geometry,
    speculative: str | None,
    chunked: int,
    graph_bs: int,
    piecewise: bool,
    draft_reserve: bool = True,
) -> float:
    """server_args.py ``_handle_gpu_memory_settings``: the --mem-fraction-static SGLang chooses
    when it is unset: (GPU - reserved) / GPU, rounded to 3 places, with reserved at least 10 GiB on
    GPUs over 60 GiB, + 4 GiB for an EAGLE-family draft (6 GiB STANDALONE) where the version
    reserves for it (``draft_reserve``: 0.5.11), then scaled for a vision tower
    (``adjust_mem_fraction_for_vlm``)."""
    reserved = activation_reserve_mib(gpu_mib, tp, chunked, graph_bs, piecewise)
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if not draft_reserve:
        pass
    elif speculative == "STANDALONE":
        reserved += 6 * 1024
    elif speculative not in (None, "NGRAM"):
        reserved += 4 * 1024
    return round((gpu_mib - reserved) / gpu_mib, 3) * vlm_factor(geo.vision)


# --------------------------------------------------------------------------------------
# The budget
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """The launch knobs that size SGLang's pools (None: SGLang's own default)."""

    gpu_memory_mib: int
    tp: int
    weights_bytes: int
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    speculative_algorithm: str | None = None
    draft_tokens: int | None = None
    extra_buffer: bool = False
    radix_cache: bool = True
    overlap: bool = True
    page_size: int = 1
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    piecewise_cuda_graph: bool = True
    max_mamba_cache_size: int | None = None
    max_total_tokens: int | None = None
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    kv_bytes: int = 2
    conv_bytes: int = 2  # SGLANG_MAMBA_CONV_DTYPE (bfloat16)
    ssm_bytes: int | None = None  # SGLANG_MAMBA_SSM_DTYPE; None: the config's mamba_ssm_dtype
    rules: str = "0.5.11"  # the SGLang version's budget rules (:data:`RULES`)


@dataclass(frozen=True)
class Budget:
    """SGLang's pools per GPU for one launch (GiB are 2**30 bytes, as SGLang's logs' "GB")."""

    gpu_gib: float
    tp: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    default_mem_fraction_static: float
    mem_fraction_static: float
    available_gib: float  # before the weights load
    weights_gib: float  # the target's, loaded
    static_gib: float  # mem_fraction_static x available
    requested_running: int | None  # the --max-running-requests SGLang sizes the verify buffers for
    draft_tokens: int
    mamba_conv_bytes: int  # per request, all linear layers
    mamba_ssm_bytes: int
    verify_reserved_gib: float
    mamba_slots: int
    mamba_gib: float
    kv_bytes_per_token: int
    kv_gib: float
    kv_tokens: int
    slots_per_request: int
    max_running: int  # effective
    context_length: int  # SGLang's context length (--context-length or the model's)
    longest_request: int  # max_req_len: min(context, KV tokens) - 1
    verify_allocated_gib: float
    draft_weights_load_gib: float
    draft_weights_gib: float
    draft_kv_gib: float
    activations_gib: float
    free_after_pools_gib: float  # beside the target's pools as allocated
    draft_modelled: bool
    rules: str = "0.5.11"  # whose rules sized it (:data:`RULES`)
    before_pools_gib: float = 0.0  # 0.5.17: the draft's weights and what else loads before the pools

    @property
    def mamba_per_request_gib(self) -> float:
        """One request's linear-attention state (conv + SSM) per GPU."""
        return (self.mamba_conv_bytes + self.mamba_ssm_bytes) / GIB

    @property
    def starts(self) -> bool:
        """SGLang gets a KV pool and at least one running request (else it stops at start-up)."""
        return self.kv_tokens > 0 and self.max_running >= 1

    @property
    def draft_first(self) -> bool:
        """The draft's weights load before the pools are sized, inside the static part (0.5.17)."""
        return budget_rules(self.rules).draft_first

    @property
    def mamba_cap(self) -> int:
        """The most running requests the mamba slots hold (0.5.17 caps to it, logging so)."""
        return self.mamba_slots // self.slots_per_request

    @property
    def outside_need_gib(self) -> float:
        """What must fit beside the target's pools: the draft while it loads (unless it loaded
        first, inside them), its KV, activations."""
        if self.draft_first:
            return self.draft_kv_gib + self.activations_gib
        return self.draft_weights_load_gib + self.draft_kv_gib + self.activations_gib

    @property
    def outside_fits(self) -> bool:
        """The draft, its KV pool and SGLang's activation estimate fit beside the target's pools."""
        return self.free_after_pools_gib >= self.outside_need_gib

    def as_dict(self) -> dict[str, Any]:
        """Every field (GiB rounded to 0.01) and the derived terms, for plan["budget"] and JSON."""
        out = {
            k: (round(v, 3) if k.endswith("fraction_static") else round(v, 2)) if isinstance(v, float) else v
            for k, v in dataclasses.asdict(self).items()
        }
        out.update(
            mamba_per_request_gib=round(self.mamba_per_request_gib, 4),
            outside_need_gib=round(self.outside_need_gib, 2),
            starts=self.starts,
            outside_fits=self.outside_fits,
        )
        return out


def compute_budget(geo: shapes.Geometry, launch: Launch) -> Budget:
    """SGLang's pool sizes per GPU for ``launch``, by the rules ``launch.rules`` names (see the
    module docstring for the sources).

    0.5.11, model_runner_kv_cache_mixin.py: ``_profile_available_bytes`` (rest = available after
    the weights - available before x (1 - mem_fraction_static)), ``handle_max_mamba_cache``
    (:func:`mamba_pool`), pool_configurator.py ``calculate_pool_sizes`` (KV tokens = rest // bytes
    per token, page aligned; ``MemoryPoolConfig`` raises "Not enough memory" at 0 or less) and
    ``_resolve_max_num_reqs`` / ``_calculate_mamba_ratio`` (effective running requests).
    0.5.17, mem_cache/kv_cache_configurator.py: the same steps in ``_profile_available_bytes``,
    ``_handle_max_mamba_cache``, ``config_from_budget`` and ``resolve_max_num_reqs``, with the
    draft's weights loaded before them (model_runner.py, "Load weight end. type=
    Qwen3_5ForCausalLMMTP" comes before "Mamba Cache is allocated") and the running requests
    bounded by tokens // 2 instead of the estimate.
    """
    rules = budget_rules(launch.rules)
    tp = launch.tp
    gpu_mib = float(launch.gpu_memory_mib)
    tier = memory_tier(gpu_mib, tp)
    chunked = launch.chunked_prefill_size or tier[0]
    graph_bs = launch.cuda_graph_max_bs or tier[1]
    algo = launch.speculative_algorithm
    piecewise = launch.piecewise_cuda_graph and geo.vision is None  # _handle_piecewise_cuda_graph
    # 0.5.17's default fraction counts the prefill graphs of a vision model too (reserve_for_graph_mb).
    prefill_graphs = piecewise or (launch.piecewise_cuda_graph and rules.prefill_graphs_with_vision)
    default = default_mem_fraction(
        gpu_mib, tp, geo, algo, chunked, graph_bs, prefill_graphs, draft_reserve=rules.default_draft_reserve
    )
    fraction = launch.mem_fraction_static if launch.mem_fraction_static is not None else default
    available = gpu_mib * MIB / GIB - rules.cuda_context_gib
    mtp = shapes.mtp_weight_bytes(geo)
    rotary = shapes.rotary_cache_bytes(geo)
    weights = ((launch.weights_bytes - mtp) / tp + rotary) / GIB
    nextn = algo in ("NEXTN", "EAGLE") and geo.mtp_layers > 0
    draft_steady = mtp / tp / GIB if nextn else 0.0
    draft_load = (mtp + shapes.embedding_bytes(geo)) / tp / GIB if nextn else 0.0
    before_pools = draft_load + rules.before_pools_gib if rules.draft_first else 0.0
    rest = fraction * available - weights
    if rules.draft_first:
        rest -= before_pools
    draft = launch.draft_tokens or (DEFAULT_DRAFT_TOKENS if algo else 0)
    requested = launch.max_running_requests
    if requested is None and algo is not None:
        requested = SPECULATIVE_MAX_RUNNING
    if launch.ssm_bytes is not None:
        geo = dataclasses.replace(geo, ssm_bytes=launch.ssm_bytes)
    conv, ssm = shapes.mamba_state_bytes(geo, tp, launch.conv_bytes)
    per_req = (conv + ssm) / GIB
    per_slot = slots_per_request(launch)
    slots, verify, rest = mamba_pool(geo, launch, rules, rest, conv + ssm, requested, draft, per_slot)
    cell = shapes.kv_bytes_per_token(geo, tp, launch.kv_bytes)
    page = max(1, launch.page_size)
    tokens = int(rest * GIB // cell) // page * page
    if launch.max_total_tokens is not None:
        tokens = min(tokens, launch.max_total_tokens // page * page)
    context = launch.context_length or geo.max_positions
    estimated = max(min(int(tokens / context * 512), 4096), 2048) if context else 2048
    if requested is None:
        running = min(estimated, tokens // 2)
    else:
        running = min(requested, tokens // 2 if rules.caps_running else estimated)
    if geo.hybrid:
        running = min(running, slots // per_slot)
    running = max(running, 0)
    if rules.joint_mamba_solve:  # the intermediates were sized from the capped count already
        allocated_verify = verify
    else:
        allocated_verify = per_req * (running + 1) * draft if algo is not None and geo.hybrid else 0.0
    kv_gib = max(tokens, 0) * cell / GIB
    mamba_allocated = (slots + 1) * per_req if geo.hybrid else 0.0
    draft_kv = (
        max(tokens, 0) * shapes.kv_bytes_per_token(geo, tp, launch.kv_bytes, geo.mtp_layers) / GIB if nextn else 0.0
    )
    activations = activation_reserve_mib(gpu_mib, tp, chunked, graph_bs, piecewise) / 1024
    free = available - weights - mamba_allocated - allocated_verify - kv_gib
    if rules.draft_first:
        free -= before_pools
    # fmt: off
    return Budget(
        gpu_gib=gpu_mib / 1024, tp=tp, chunked_prefill_size=chunked, cuda_graph_max_bs=graph_bs,
        default_mem_fraction_static=default, mem_fraction_static=fraction, available_gib=available,
        weights_gib=weights, static_gib=fraction * available, requested_running=requested, draft_tokens=draft,
        mamba_conv_bytes=conv, mamba_ssm_bytes=ssm, verify_reserved_gib=verify, mamba_slots=slots,
        mamba_gib=slots * per_req, kv_bytes_per_token=cell, kv_gib=kv_gib, kv_tokens=tokens,
        slots_per_request=per_slot, max_running=running, context_length=context,
        longest_request=max(min(context, tokens) - 1, 0), verify_allocated_gib=allocated_verify,
        draft_weights_load_gib=draft_load, draft_weights_gib=draft_steady, draft_kv_gib=draft_kv,
        activations_gib=activations, free_after_pools_gib=free, draft_modelled=nextn or algo in (None, "NGRAM"),
        rules=rules.name, before_pools_gib=before_pools)
    # fmt: on


def mamba_pool(
    geo: shapes.Geometry,
    launch: Launch,
    rules: Rules,
    rest: float,
    state_bytes: int,
    requested: int | None,
    draft: int,
    per_slot: int,
) -> tuple[int, float, float]:
    """The mamba slots, the speculative verify buffers (GiB) and the GiB left for the KV cache from
    ``rest`` (the static pools after the weights), with one request's state ``state_bytes``.

    An explicit ``--max-mamba-cache-size`` wins; without the radix cache ``--max-running-requests``
    slots; otherwise --mamba-full-memory-ratio (0.9) of every 1.9 GiB goes to the mamba cache.

    0.5.11, model_runner_kv_cache_mixin.py ``handle_max_mamba_cache``: the verify buffers (state x
    --max-running-requests, 48 unset, x draft tokens) are reserved first, then slots = int(rest x
    ratio / (1 + ratio) / state); the KV cache gets what is left after slots x state.

    0.5.17, mem_cache/kv_cache_configurator.py ``_handle_max_mamba_cache``: the slots K and the
    intermediates are solved together inside the mamba share, (K + 1) x state + (K / slots per
    request + 1) x draft tokens x state = share, so K = int((share - state x (1 + draft)) //
    (state x (1 + draft / slots per request))); the verify buffers are then sized for min(asked,
    K // slots per request) + 1 requests (+ 1: the pool's padding slot) and the KV cache gets what
    is left after them and (K + 1) x state. K of 0 or less stops SGLang ("Not enough GPU memory for
    hybrid (mamba/linear-attention) state cache"); the caller's budget then does not start.
    """
    per_req = state_bytes / GIB
    speculative = launch.speculative_algorithm is not None
    ratio = launch.mamba_full_memory_ratio
    if not rules.joint_mamba_solve:
        verify = per_req * (requested or 0) * draft if speculative else 0.0
        rest -= verify
        if not geo.hybrid:
            slots = 0
        elif launch.max_mamba_cache_size is not None:
            slots = launch.max_mamba_cache_size
        elif not launch.radix_cache and launch.max_running_requests is not None:
            slots = launch.max_running_requests
        else:
            slots = int((rest * ratio / (1 + ratio) * GIB) // state_bytes)
        return slots, verify, rest - slots * per_req
    if not geo.hybrid:
        return 0, 0.0, rest
    if launch.max_mamba_cache_size is not None:
        slots = launch.max_mamba_cache_size
        verify_for = min(requested, slots // per_slot) + 1 if speculative and requested is not None else 0
    elif not launch.radix_cache and launch.max_running_requests is not None:
        slots = launch.max_running_requests
        verify_for = slots + 1 if speculative else 0
    elif speculative and requested is not None:
        share = rest * ratio / (1 + ratio) * GIB
        slots = int((share - state_bytes * (1 + draft)) // (state_bytes * (1 + draft / per_slot)))
        verify_for = min(requested, slots // per_slot) + 1
    else:
        share = rest * ratio / (1 + ratio) * GIB
        slots = int((share - state_bytes) // state_bytes)
        verify_for = 0
    verify = per_req * verify_for * draft
    return slots, verify, rest - verify - (slots + 1) * per_req


def slots_per_request(launch: Launch) -> int:
    """model_runner_kv_cache_mixin.py ``_calculate_mamba_ratio``: mamba slots per running request:
    1 without the radix cache, else 3, + 2 ping-pong buffers with extra_buffer and the overlap
    scheduler (+ 1 without overlap)."""
    if not launch.radix_cache:
        return 1
    extra = 0
    if launch.extra_buffer:
        extra = MAMBA_EXTRA_BUFFER_OVERLAP if launch.overlap else MAMBA_EXTRA_BUFFER_NO_OVERLAP
    return MAMBA_SLOTS_PER_REQUEST + extra


def acceptable(budget: Budget, running: int | None, min_context: int) -> bool:
    """The launch starts, runs ``running`` requests (when given) and leaves ``min_context`` tokens."""
    return (
        budget.starts
        and budget.outside_fits
        and budget.longest_request + 1 >= min_context
        and (running is None or budget.max_running >= running)
    )


def largest_running(geo: shapes.Geometry, launch: Launch, min_context: int, cap: int = SPECULATIVE_MAX_RUNNING) -> int:
    """The most running requests (at most ``cap``) the budget holds in full with ``min_context``; 0: none."""
    for count in range(cap, 0, -1):
        budget = compute_budget(geo, dataclasses.replace(launch, max_running_requests=count))
        if acceptable(budget, count, min_context):
            return count
    return 0


def fraction_bounds(
    geo: shapes.Geometry, launch: Launch, running: int | None, min_context: int
) -> tuple[float, float] | None:
    """The lowest and highest --mem-fraction-static (0.001 steps) with which ``launch`` is acceptable."""
    good = [
        f / 1000
        for f in range(300, 991)
        if acceptable(
            compute_budget(geo, dataclasses.replace(launch, mem_fraction_static=f / 1000)), running, min_context
        )
    ]
    return (good[0], good[-1]) if good else None
