"""Memory budget per GPU of an SGLang launch, by SGLang 0.5.11's own rules.

SGLang sizes its pools once, at start-up, from what is left of the GPU after the weights:
``--mem-fraction-static`` of the memory available before the weights load holds the
weights, the mamba (linear-attention) state slots, the speculative verify buffers and the
KV cache; the rest is left for activations, CUDA graphs and the speculative draft model,
which is loaded afterwards and gets a KV pool of the same token count. When the static part
cannot hold the verify buffers and a KV cache, SGLang stops with ``RuntimeError: Not enough
memory. Please try to increase --mem-fraction-static.``; when the rest cannot hold the draft,
it stops with a CUDA out-of-memory error. This module computes all of that offline, from the
model's ``config.json``, the GPU size, the tensor-parallel size and the weights' size, so the
launch plan can set ``--mem-fraction-static``, ``--max-running-requests`` and
``--context-length`` itself and refuse a launch that cannot start. Each rule names the
SGLang 0.5.11 function it follows (docs/launch-plan.md, "Memory budget").

Pure functions and frozen dataclasses, standard library only. ``PlanError`` lives here so
that both this module and launch_plan.py (which imports it by path) raise the same class.
The Ansible filter ``memory_budget`` returns :meth:`Budget.as_dict`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

try:  # Ansible is optional: tools and tests import this module directly.
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - exercised only without ansible-core
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]

GIB = 1024**3
MIB = 1024**2

# Memory the CUDA context, NCCL and torch take before the weights load, per GPU. Measured
# with SGLang 0.5.11 on one H200 (bench/realsize; figures in
# tests/fixtures/sglang_realsize_h200_logged.json): nvidia-smi's
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
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


class PlanError(ValueError):
    """A refusal: one sentence that names the variable to change and what to do."""


# --------------------------------------------------------------------------------------
# The model's shapes, from config.json
# --------------------------------------------------------------------------------------


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config.json: ``text_config`` when nested, else the config."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


@dataclass(frozen=True)
class Geometry:
    """What sizes SGLang's pools: attention, linear-attention (mamba) and MTP shapes."""

    hidden: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    weight_bytes: int  # bytes per weight element (the model's dtype)
    heads: int
    kv_heads: int
    head_dim: int
    attn_output_gate: bool
    full_layers: int
    linear_layers: int
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    conv_kernel: int
    ssm_bytes: int  # mamba_ssm_dtype (float32 by default)
    mtp_layers: int
    max_positions: int
    rotary_dim: int
    vision: Mapping[str, Any] | None  # vision_config, for SGLang's multimodal adjustment

    @property
    def hybrid(self) -> bool:
        """True when the model has linear-attention layers (SGLang keeps mamba state for them)."""
        return self.linear_layers > 0


def geometry(config: Mapping[str, Any]) -> Geometry:
    """Read :class:`Geometry` from a nested or flat config.json (missing keys count as 0)."""
    text = text_config(config)

    def num(key: str, default: int = 0) -> int:
        value = text.get(key)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    layer_types = [str(t) for t in text.get("layer_types") or ()]
    layers = num("num_hidden_layers")
    linear = sum(1 for t in layer_types if t == "linear_attention")
    heads = num("num_attention_heads")
    head_dim = num("head_dim") or (num("hidden_size") // heads if heads else 0)
    mtp = num("mtp_num_hidden_layers") or num("num_nextn_predict_layers")
    rope = text.get("rope_parameters") if isinstance(text.get("rope_parameters"), Mapping) else {}
    partial = text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    dtype = str(text.get("dtype") or text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    vision = config.get("vision_config")
    return Geometry(
        hidden=num("hidden_size"),
        intermediate=num("intermediate_size"),
        vocab=num("vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        weight_bytes=DTYPE_BYTES.get(dtype, 2),
        heads=heads,
        kv_heads=num("num_key_value_heads") or heads,
        head_dim=head_dim,
        attn_output_gate=bool(text.get("attn_output_gate", False)),
        full_layers=(len(layer_types) - linear) if layer_types else layers,
        linear_layers=linear,
        linear_key_heads=num("linear_num_key_heads"),
        linear_value_heads=num("linear_num_value_heads"),
        linear_key_dim=num("linear_key_head_dim"),
        linear_value_dim=num("linear_value_head_dim"),
        conv_kernel=num("linear_conv_kernel_dim", 4),
        ssm_bytes=DTYPE_BYTES.get(str(text.get("mamba_ssm_dtype") or "float32"), 4),
        mtp_layers=mtp,
        max_positions=num("max_position_embeddings"),
        rotary_dim=int(head_dim * float(partial or 1.0)),
        vision=vision if isinstance(vision, Mapping) and not config.get("language_model_only") else None,
    )


def mamba_state_bytes(geo: Geometry, tp: int, conv_bytes: int = 2) -> tuple[int, int]:
    """Bytes of one request's linear-attention state per GPU: (conv, SSM), all linear layers.

    configs/qwen3_next.py ``mamba2_cache_params`` and configs/mamba_utils.py
    ``Mamba2StateShape.create`` / ``mamba_cache_per_req``: conv state (conv_dim / tp, kernel - 1)
    with conv_dim = value heads x value dim + 2 x key heads x key dim, in bf16
    (``SGLANG_MAMBA_CONV_DTYPE``); SSM state (value heads / tp, value dim, key dim) in
    ``mamba_ssm_dtype`` (float32).
    """
    if not geo.hybrid:
        return 0, 0
    groups = geo.linear_key_heads
    if groups % tp:
        groups += tp - groups  # extra_groups_for_head_shards
    conv_dim = geo.linear_value_heads * geo.linear_value_dim + 2 * groups * geo.linear_key_dim
    conv = conv_dim // tp * (geo.conv_kernel - 1) * conv_bytes
    ssm = geo.linear_value_heads // tp * geo.linear_value_dim * geo.linear_key_dim * geo.ssm_bytes
    return conv * geo.linear_layers, ssm * geo.linear_layers


def kv_bytes_per_token(geo: Geometry, tp: int, kv_bytes: int, layers: int | None = None) -> int:
    """pool_configurator.py ``DefaultPoolConfigurator._compute_cell_size``: KV heads per GPU
    (``get_num_kv_heads``: at least 1) x (K + V head dims) x full-attention layers x dtype."""
    return max(1, geo.kv_heads // tp) * 2 * geo.head_dim * (geo.full_layers if layers is None else layers) * kv_bytes


def mtp_weight_bytes(geo: Geometry) -> int:
    """Bytes of the MTP head's own tensors (``mtp.*`` in the checkpoint, not loaded by the target):
    per MTP layer one full-attention decoder layer (q with its output gate, k, v, o, a dense MLP)
    plus the fc that joins embedding and hidden state (models/qwen3_5_mtp.py)."""
    if not geo.mtp_layers:
        return 0
    h = geo.hidden
    q = geo.heads * geo.head_dim * (2 if geo.attn_output_gate else 1)
    attention = h * q + 2 * h * geo.kv_heads * geo.head_dim + geo.heads * geo.head_dim * h + 2 * geo.head_dim
    layer = attention + 3 * h * geo.intermediate + 2 * h
    return geo.mtp_layers * (layer + 2 * h * h + 3 * h) * geo.weight_bytes


def embedding_bytes(geo: Geometry) -> int:
    """Bytes of the input embedding and the LM head (one when tied)."""
    return geo.vocab * geo.hidden * geo.weight_bytes * (1 if geo.tied_embeddings else 2)


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
    gpu_mib: float, tp: int, geo: Geometry, speculative: str | None, chunked: int, graph_bs: int, piecewise: bool
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


def compute_budget(geo: Geometry, launch: Launch) -> Budget:
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
    mtp = mtp_weight_bytes(geo)
    rotary = rotary_cache_bytes(geo)
    weights = ((launch.weights_bytes - mtp) / tp + rotary) / GIB
    rest = fraction * available - weights
    draft = launch.draft_tokens or (DEFAULT_DRAFT_TOKENS if algo else 0)
    requested = launch.max_running_requests
    if requested is None and algo is not None:
        requested = SPECULATIVE_MAX_RUNNING
    if launch.ssm_bytes is not None:
        geo = dataclasses.replace(geo, ssm_bytes=launch.ssm_bytes)
    conv, ssm = mamba_state_bytes(geo, tp, launch.conv_bytes)
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
    cell = kv_bytes_per_token(geo, tp, launch.kv_bytes)
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
    draft_load = (mtp + embedding_bytes(geo)) / tp / GIB if nextn else 0.0
    draft_kv = max(tokens, 0) * kv_bytes_per_token(geo, tp, launch.kv_bytes, geo.mtp_layers) / GIB if nextn else 0.0
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


def rotary_cache_bytes(geo: Geometry) -> int:
    """The rotary embedding's cos/sin cache the target builds beside its weights:
    max_position_embeddings x rotary dims in float32 (layers/rotary_embedding.py
    ``_compute_cos_sin_cache``; one cache, shared through ``get_rope``'s cache)."""
    return geo.max_positions * geo.rotary_dim * 4


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


def largest_running(geo: Geometry, launch: Launch, min_context: int, cap: int = SPECULATIVE_MAX_RUNNING) -> int:
    """The most running requests (at most ``cap``) the budget holds in full with ``min_context``; 0: none."""
    for count in range(cap, 0, -1):
        budget = compute_budget(geo, dataclasses.replace(launch, max_running_requests=count))
        if acceptable(budget, count, min_context):
            return count
    return 0


def fraction_bounds(geo: Geometry, launch: Launch, running: int | None, min_context: int) -> tuple[float, float] | None:
    """The lowest and highest --mem-fraction-static (0.001 steps) with which ``launch`` is acceptable."""
    good = [
        f / 1000
        for f in range(300, 991)
        if acceptable(
            compute_budget(geo, dataclasses.replace(launch, mem_fraction_static=f / 1000)), running, min_context
        )
    ]
    return (good[0], good[-1]) if good else None


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
    tp_source = flags.source(tp_flag) if flags.has(tp_flag) else "inference_server_settings.tensor_parallel_size"
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
            f"{gib(headroom / GIB)} headroom (inference_server_settings.gpu_memory_headroom_gib) "
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


def launch_from_flags(flags: Flags, env: Mapping[str, str], tp: int, gpu_mib: int, weights_bytes: int) -> Launch:
    """The :class:`Launch` an argv describes (flags SGLang would read; the rest at its defaults)."""

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
) -> dict[str, Any]:
    """Set --mem-fraction-static, --max-running-requests and (when the KV cache cannot hold the
    model's context) --context-length from the budget, refuse what cannot start or leaves less than
    the settings' minimums, add the budget's table to ``notes`` and return it for plan["budget"]."""
    geo = geometry(config)
    launch = launch_from_flags(flags, env, tp, gpu_mib, weights_bytes)
    target = settings.get("target_concurrency")
    min_context = settings.get("min_context_length") or DEFAULT_MIN_CONTEXT_LENGTH
    min_source = (
        "inference_server_settings.min_context_length"
        if settings.get("min_context_length")
        else "the plan's default min_context_length"
    )
    if launch.mem_fraction_static is None:
        chosen = round(compute_budget(geo, launch).default_mem_fraction_static, 3)
        flags.set("--mem-fraction-static", chosen, "the plan: SGLang's own default for this GPU")
        launch = dataclasses.replace(launch, mem_fraction_static=chosen)
    if launch.max_running_requests is None and "--max-running-requests" not in getattr(flags, "removed", {}):
        running = target
        source = "the plan: inference_server_settings.target_concurrency"
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
            f"raise mem_fraction_static to at least {bounds[0]}"
            if bounds
            else "raise tensor_parallel_size or use GPUs with more memory"
        )
        return " or ".join(options)

    key = (
        "target_concurrency"
        if running_src.startswith("the plan")
        else running_src
        if flags.has("--max-running-requests")
        else "inference_server_settings.max_running_requests"
    )
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
        change = (
            f"lower mem_fraction_static to at most {top[1]}"
            if top
            else "lower mem_fraction_static or raise tensor_parallel_size"
        )
        raise PlanError(
            f"{frac} leaves {gib(budget.free_after_pools_gib)} per GPU beside SGLang's "
            f"pools, but the MTP draft ({gib(budget.draft_weights_load_gib)} while it loads), its KV cache "
            f"({gib(budget.draft_kv_gib)}) and SGLang's activation and CUDA-graph estimate "
            f"({gib(budget.activations_gib)}) need {gib(budget.outside_need_gib)}: {change}."
        )
    if target is not None and budget.max_running < target:
        raise PlanError(
            f"inference_server_settings.target_concurrency is {target}, but the memory budget per GPU "
            f"({frac}, {running}) holds only {budget.max_running} running "
            f"requests ({budget.mamba_slots} mamba slots at {budget.slots_per_request} per request): "
            f"{todo('target_concurrency')}."
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
            f"{min_context}: raise it or lower min_context_length."
        )
    if budget.kv_tokens < min_context:
        raise PlanError(
            f"the memory budget per GPU ({frac}, {running}) leaves a KV cache of {budget.kv_tokens} tokens, less "
            f"than {min_source} {min_context}: {todo(key)} or lower min_context_length."
        )


def budget_notes(budget: Budget, flags: Flags, geo: Geometry) -> list[str]:
    """The budget as a table, one note per row."""
    mib = budget.mamba_per_request_gib * 1024
    rows = [
        ("GPU memory (nvidia-smi) x tensor parallel", f"{gib(budget.gpu_gib)} x {budget.tp}"),
        (f"available before the weights (- {CUDA_CONTEXT_GIB} GiB CUDA context)", gib(budget.available_gib)),
        (
            f"--mem-fraction-static (SGLang's default here {budget.default_mem_fraction_static:.3f})",
            f"{budget.mem_fraction_static:.3f} = {gib(budget.static_gib)} static pools",
        ),
        ("target weights (without the MTP head; + rotary cache)", gib(budget.weights_gib)),
        (
            f"verify buffers reserved ({budget.requested_running or 0} requests x {budget.draft_tokens} draft tokens "
            f"x {mib:.1f} MiB)",
            gib(budget.verify_reserved_gib),
        ),
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
            "beside the pools: draft load + draft KV + activations",
            f"{gib(budget.outside_need_gib)} of {gib(budget.free_after_pools_gib)} free",
        ),
    ]
    out = ['memory budget per GPU by SGLang 0.5.11\'s rules (docs/launch-plan.md, "Memory budget"), one row per term:']
    out += [f"budget | {label:<74} | {value}" for label, value in rows]
    if budget.requested_running is not None and budget.max_running < budget.requested_running:
        out.append(
            f"SGLang will run at most {budget.max_running} of the {budget.requested_running} requests asked "
            f"({flags.source('--max-running-requests')}): its mamba slots allow no more"
        )
    if not budget.draft_modelled:
        out.append(
            f"the {flags.get('--speculative-algorithm')} draft model's own memory is not in the budget "
            "(only NEXTN's MTP head is modelled)"
        )
    return out


def memory_budget(model_config: Mapping[str, Any], **launch: Any) -> dict[str, Any]:
    """Ansible filter: the budget of one launch (keyword arguments: the fields of :class:`Launch`)."""
    try:
        return compute_budget(geometry(model_config), Launch(**launch)).as_dict()
    except TypeError as err:
        raise AnsibleFilterError(f"memory_budget: {err}") from None


class FilterModule:
    """Ansible filters for SGLang's memory budget."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """Map filter names to functions."""
        return {"memory_budget": memory_budget}
