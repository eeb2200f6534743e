"""Memory budget, arithmetic part: SGLang 0.5.11's pools per GPU for one launch.

SGLang sizes its pools once, at start-up, from what is left of the GPU after the weights:
``--mem-fraction-static`` of the memory available before the weights load holds the
weights, the mamba (linear-attention) state slots, the speculative verify buffers and the
KV cache; the rest is left for activations, CUDA graphs and the speculative draft model,
which is loaded afterwards and gets a KV pool of the same token count. This part holds
SGLang's defaults (its own ``--mem-fraction-static``), the launch knobs (:class:`Launch`), the
budget (:func:`compute_budget`, :class:`Budget`) and the searches over it; the model's shapes
are launch_plan_shapes.py, the plan's choices and refusals launch_plan_budget.py (which
re-exports these names). Each rule names the SGLang 0.5.11 function it follows
(docs/launch-plan.md, "Memory budget").

Pure functions and frozen dataclasses, standard library only. ``PlanError`` lives here so
that every part of the launch plan raises the same class.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Ansible imports each filter plugin under a name of its own: the parts of the launch plan
# find one another by file name, in this directory.
if (_PARTS := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.append(_PARTS)

import launch_plan_draft as draft  # noqa: E402
import launch_plan_shapes as shapes  # noqa: E402

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
# What the plan leaves as the longest context when inference_server_settings.min_context_length
# is unset, and the granularity of the --context-length it sets.
DEFAULT_MIN_CONTEXT_LENGTH = 32768
CONTEXT_STEP = 1024


class PlanError(ValueError):
    """A refusal: one sentence that names the variable to change and what to do."""


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
    gpu_mib: float, tp: int, geo: shapes.Geometry, speculative: str | None, chunked: int, graph_bs: int, piecewise: bool
) -> float:
    """server_args.py ``_handle_gpu_memory_settings``: the --mem-fraction-static SGLang chooses
    when it is unset: (GPU - reserved) / GPU, rounded to 3 places, with reserved at least 10 GiB on
    GPUs over 60 GiB, + 4 GiB for an EAGLE-family draft (6 GiB STANDALONE), then scaled for a
    vision tower (``adjust_mem_fraction_for_vlm``)."""
    reserved = activation_reserve_mib(gpu_mib, tp, chunked, graph_bs, piecewise)
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative == "STANDALONE":
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

    @property
    def mamba_per_request_gib(self) -> float:
        """One request's linear-attention state (conv + SSM) per GPU."""
        return (self.mamba_conv_bytes + self.mamba_ssm_bytes) / GIB

    @property
    def starts(self) -> bool:
        """SGLang gets a KV pool and at least one running request (else it stops at start-up)."""
        return self.kv_tokens > 0 and self.max_running >= 1

    @property
    def outside_need_gib(self) -> float:
        """What must fit beside the target's pools: the draft while it loads, its KV, activations."""
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
    """SGLang 0.5.11's pool sizes per GPU for ``launch`` (see the module docstring for the sources).

    model_runner_kv_cache_mixin.py: ``_profile_available_bytes`` (rest = available after the
    weights - available before x (1 - mem_fraction_static)), ``handle_max_mamba_cache`` (verify
    buffers = per-request state x max_running_requests x draft tokens, reserved first; then mamba
    slots = rest x ratio / (1 + ratio) / per-request state, ratio --mamba-full-memory-ratio 0.9),
    pool_configurator.py ``calculate_pool_sizes`` (KV tokens = rest // bytes per token, page
    aligned; ``MemoryPoolConfig`` raises "Not enough memory" at 0 or less) and
    ``_resolve_max_num_reqs`` / ``_calculate_mamba_ratio`` (effective running requests).
    """
    tp = launch.tp
    gpu_mib = float(launch.gpu_memory_mib)
    tier = memory_tier(gpu_mib, tp)
    chunked = launch.chunked_prefill_size or tier[0]
    graph_bs = launch.cuda_graph_max_bs or tier[1]
    algo = launch.speculative_algorithm
    piecewise = launch.piecewise_cuda_graph and geo.vision is None  # _handle_piecewise_cuda_graph
    default = default_mem_fraction(gpu_mib, tp, geo, algo, chunked, graph_bs, piecewise)
    fraction = launch.mem_fraction_static if launch.mem_fraction_static is not None else default
    available = gpu_mib * MIB / GIB - CUDA_CONTEXT_GIB
    mtp = shapes.mtp_weight_bytes(geo)
    rotary = shapes.rotary_cache_bytes(geo)
    weights = ((launch.weights_bytes - mtp) / tp + rotary) / GIB
    rest = fraction * available - weights
    draft = launch.draft_tokens or (DEFAULT_DRAFT_TOKENS if algo else 0)
    requested = launch.max_running_requests
    if requested is None and algo is not None:
        requested = SPECULATIVE_MAX_RUNNING
    if launch.ssm_bytes is not None:
        geo = dataclasses.replace(geo, ssm_bytes=launch.ssm_bytes)
    conv, ssm = shapes.mamba_state_bytes(geo, tp, launch.conv_bytes)
    per_req = (conv + ssm) / GIB
    verify = per_req * (requested or 0) * draft if algo is not None else 0.0
    rest -= verify
    if not geo.hybrid:
        slots = 0
    elif launch.max_mamba_cache_size is not None:
        slots = launch.max_mamba_cache_size
    elif not launch.radix_cache and launch.max_running_requests is not None:
        slots = launch.max_running_requests
    else:
        ratio = launch.mamba_full_memory_ratio
        slots = int((rest * ratio / (1 + ratio) * GIB) // (conv + ssm))
    rest -= slots * per_req
    cell = shapes.kv_bytes_per_token(geo, tp, launch.kv_bytes)
    page = max(1, launch.page_size)
    tokens = int(rest * GIB // cell) // page * page
    if launch.max_total_tokens is not None:
        tokens = min(tokens, launch.max_total_tokens // page * page)
    context = launch.context_length or geo.max_positions
    estimated = max(min(int(tokens / context * 512), 4096), 2048) if context else 2048
    running = min(requested, estimated) if requested is not None else min(estimated, tokens // 2)
    per_slot = slots_per_request(launch)
    if geo.hybrid:
        running = min(running, slots // per_slot)
    running = max(running, 0)
    allocated_verify = per_req * (running + 1) * draft if algo is not None and geo.hybrid else 0.0
    kv_gib = max(tokens, 0) * cell / GIB
    mamba_allocated = (slots + 1) * per_req if geo.hybrid else 0.0
    nextn = algo in ("NEXTN", "EAGLE") and geo.mtp_layers > 0
    draft_steady = mtp / tp / GIB if nextn else 0.0
    draft_load = (mtp + shapes.embedding_bytes(geo)) / tp / GIB if nextn else 0.0
    draft_kv = (
        max(tokens, 0) * shapes.kv_bytes_per_token(geo, tp, launch.kv_bytes, geo.mtp_layers) / GIB if nextn else 0.0
    )
    activations = activation_reserve_mib(gpu_mib, tp, chunked, graph_bs, piecewise) / 1024
    free = available - weights - mamba_allocated - allocated_verify - kv_gib
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
        activations_gib=activations, free_after_pools_gib=free, draft_modelled=nextn or algo in (None, "NGRAM"))
    # fmt: on


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


# Ansible loads every file of filter_plugins: this part adds no filter of its own.
FilterModule = draft.FilterModule
