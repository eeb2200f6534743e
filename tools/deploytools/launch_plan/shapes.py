"""Memory budget, model part: the shapes of a model that size SGLang's pools (0.5.11's and 0.5.17's alike).

Read from the model's ``config.json`` (nested ``text_config`` or flat): the attention and
linear-attention (mamba) geometry, one request's mamba state, the KV cache's bytes per token,
the MTP head's and the embeddings' weights and the rotary cache. Each rule names the SGLang
0.5.11 function it follows (docs/launch-plan.md, "Memory budget"); the budget itself is
launch_plan/pools.py, the plan's choices launch_plan/budget.py (which re-exports these names).
Pure functions and a frozen dataclass, standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


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


def rotary_cache_bytes(geo: Geometry) -> int:
    """The rotary embedding's cos/sin cache the target builds beside its weights:
    max_position_embeddings x rotary dims in float32 (layers/rotary_embedding.py
    ``_compute_cos_sin_cache``; one cache, shared through ``get_rope``'s cache)."""
    return geo.max_positions * geo.rotary_dim * 4
