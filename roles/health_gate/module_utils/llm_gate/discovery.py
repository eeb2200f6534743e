# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Discovery: what the server is (engine, version, model) and its MTP accept length."""

from __future__ import annotations

import http.client
import json
from typing import Any

from .client import Endpoint, quote_body

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
SERVER_INFO_KEYS = (
    "version",
    "model_path",
    "served_model_name",
    "tp_size",
    "dp_size",
    "dtype",
    "context_length",
    "max_running_requests",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "mamba_scheduler_strategy",
    "attention_backend",
    "disable_radix_cache",
    "enable_metrics",
)


def get_server_info(endpoint: Endpoint, timeout: float) -> dict[str, Any] | None:
    """SGLang's ``/server_info`` (or the deprecated ``/get_server_info``); None elsewhere."""
    for path in SERVER_INFO_PATHS:
        try:
            status, data = endpoint.get_json(path, timeout)
        except (OSError, http.client.HTTPException):
            return None
        if status == 200 and isinstance(data, dict):
            return data
    return None


def accept_length_from_info(info: dict[str, Any] | None) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` when present (after 40 decode steps)."""
    if not info:
        return None
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def list_models(endpoint: Endpoint, timeout: float) -> tuple[list[str], str]:
    """Ids from ``/v1/models`` and a note when that fails."""
    try:
        status, data = endpoint.get_json("/v1/models", timeout)
    except (OSError, http.client.HTTPException) as exc:
        return [], f"/v1/models failed: {exc}"
    if status != 200 or not isinstance(data, dict):
        return [], f"/v1/models answered HTTP {status}"
    ids = [str(m.get("id")) for m in data.get("data") or [] if isinstance(m, dict) and m.get("id")]
    return ids, "" if ids else "/v1/models lists no model"


def resolve_model(listed: list[str], explicit: str | None) -> tuple[str | None, str]:
    """Pick the model id to send.

    The first id of ``/v1/models``, unless the explicit option is one of the listed ids;
    the explicit option when the server lists nothing (``transformers serve``).
    """
    if listed:
        if explicit and explicit in listed:
            return explicit, ""
        note = "" if not explicit else f"model {explicit!r} is not listed by /v1/models; using {listed[0]!r}"
        return listed[0], note
    if explicit:
        return explicit, ""
    return None, ""


def generate_accept_length(
    endpoint: Endpoint, prompt: dict[str, Any], max_tokens: int, timeout_s: float
) -> tuple[float | None, str]:
    """``meta_info.spec_accept_length`` of one ``/generate`` call (SGLang's native API)."""
    text = "\n\n".join(m["content"] for m in prompt["messages"])
    payload = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
    try:
        status, body = endpoint.request("POST", "/generate", payload=payload, timeout=timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        return None, f"/generate failed: {exc}"
    if status != 200:
        return None, f"/generate answered HTTP {status}: {quote_body(body, 300)}"
    try:
        data = json.loads(body.decode("utf-8"))
    except ValueError:
        return None, "/generate answered no JSON"
    if isinstance(data, list) and data:
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, dict) else None
    value = meta.get("spec_accept_length") if isinstance(meta, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), ""
    return None, "/generate meta_info has no spec_accept_length"
