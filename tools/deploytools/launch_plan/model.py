"""Launch plan, model part: what the model's ``config.json`` says that decides its launch flags.

``launch_plan.py`` (the filter) and the engine parts read the model through :func:`model_facts`:
its architecture, layer types (hybrid models mix ``linear_attention`` and full attention
layers), attention heads and MTP layers. The memory budget reads the shapes it needs itself
(``budget.geometry``). Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploytools.launch_plan import budget
from deploytools.launch_plan.errors import PlanError


@dataclass(frozen=True)
class ModelFacts:
    """The parts of a model's config.json that decide its launch flags."""

    architecture: str
    model_type: str
    num_layers: int | None
    layer_types: tuple[str, ...]
    attention_heads: int | None
    kv_heads: int | None
    linear_key_heads: int | None
    linear_value_heads: int | None
    mtp_layers: int
    max_positions: int | None

    @property
    def linear_layers(self) -> int:
        """Number of linear-attention (Gated-DeltaNet / mamba-style) layers."""
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def hybrid(self) -> bool:
        """True when any layer is linear attention (SGLang's mamba scheduler applies)."""
        return self.linear_layers > 0

    def summary(self) -> str:
        """The plan's first note: architecture, layers, attention heads and MTP layers."""
        layers = (
            f", {self.linear_layers} linear_attention + {len(self.layer_types) - self.linear_layers} "
            "full_attention (hybrid)"
            if self.hybrid
            else ""
        )
        return (
            f"model {self.architecture} ({self.model_type}): {self.num_layers} layers{layers}, "
            f"{self.attention_heads} attention heads, MTP layers {self.mtp_layers}"
        )


def model_facts(config: Mapping[str, Any]) -> ModelFacts:
    """Read a nested (``text_config``) or flat ``config.json`` into :class:`ModelFacts`."""
    if not isinstance(config, Mapping) or not config:
        raise PlanError(
            "model_sync_config is empty or not a mapping: "
            "the model's config.json must be read before planning the launch."
        )
    text = budget.text_config(config)
    archs = config.get("architectures") or text.get("architectures") or []
    if not archs:
        raise PlanError(
            "the model's config.json names no architectures: "
            "check that model_sync_model_dir holds a Hugging Face model."
        )

    def as_int(key: str, source: Mapping[str, Any] = text) -> int | None:
        """An integer field of the config (None when absent or not a number)."""
        value = source.get(key)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    mtp = as_int("mtp_num_hidden_layers")
    if mtp is None:
        mtp = as_int("num_nextn_predict_layers")  # DeepSeek-style MTP heads
    layer_types = tuple(str(t) for t in (text.get("layer_types") or ()))
    return ModelFacts(
        architecture=str(archs[0]),
        model_type=str(config.get("model_type") or text.get("model_type") or "unknown"),
        num_layers=as_int("num_hidden_layers"),
        layer_types=layer_types,
        attention_heads=as_int("num_attention_heads"),
        kv_heads=as_int("num_key_value_heads"),
        linear_key_heads=as_int("linear_num_key_heads"),
        linear_value_heads=as_int("linear_num_value_heads"),
        mtp_layers=mtp or 0,
        max_positions=as_int("max_position_embeddings"),
    )
