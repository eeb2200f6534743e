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
    "mamba_radix_cache_strategy",  # its name from SGLang 0.5.17 on (the old one stays, null)
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


def keys_readable(endpoint: Endpoint, timeout: float, keys: dict[str, str]) -> list[str]:
    """Where a holder of ``endpoint``'s API key reads one of ``keys`` (what it is -> its value).

    SGLang 0.5.11 returns its whole ``ServerArgs`` at ``/server_info`` and ``/get_server_info``,
    ``admin_api_key`` included, to anyone with the API key (``sglang/srt/entrypoints/http_server.py``,
    the NORMAL auth level of ``sglang/srt/utils/auth.py``). Each route is asked with the endpoint's
    key; an answer whose body holds a key's value is ``"<route> (<what>)"``. [] when none does or
    nothing answers (another engine).
    """
    found = []
    for path in SERVER_INFO_PATHS:
        try:
            status, body = endpoint.request("GET", path, timeout=timeout)
        except (OSError, http.client.HTTPException):
            continue
        text = body.decode("utf-8", "replace") if status == 200 else ""
        found.extend(f"{path} ({what})" for what, value in keys.items() if value and value in text)
    return found


def keys_readable_note(readable: list[str]) -> str:
    """What :func:`keys_readable`'s finding means, for the report's notes and the deploy's warning."""
    return (
        f"the API key reads the admin key at {', '.join(readable)}: every client with the API key can use the "
        "engine's admin routes (/flush_cache, /update_weights_from_disk, ...; docs/security.md)"
    )


CAPACITY_KEY = "effective_max_running_requests_per_dp"
CAPACITY_SOURCE = f"server_info.internal_states[0].{CAPACITY_KEY}"


def _first_state(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """``internal_states[0]`` of a ``/server_info`` answer (the first DP rank's scheduler), None without one."""
    states = (info or {}).get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0]
    return None


def _count(value: Any) -> int | None:
    """``value`` as a whole number of requests (0 or more), None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value < 0 or int(value) != value:  # NaN, negative, fractional
        return None
    return int(value)


def accept_length_from_info(info: dict[str, Any] | None) -> float | None:
    """``internal_states[0].avg_spec_accept_length`` when present (after 40 decode steps)."""
    value = (_first_state(info) or {}).get("avg_spec_accept_length")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def capacity_from_info(info: dict[str, Any] | None) -> dict[str, Any]:
    """How many requests the server runs at once, by its own scheduler: ``{"effective_max_running_requests",
    "requested", "source", "note"}``.

    SGLang's scheduler reports the limit it actually runs with as
    ``internal_states[0].effective_max_running_requests_per_dp``, which can be below the
    ``--max-running-requests`` asked for (the top-level ``max_running_requests``): 0.5.17 caps it
    to what the mamba state cache holds, down to 1, and still starts. Unknown (None, with a
    ``note``) when ``info`` is None or carries no such whole number.
    """
    capacity: dict[str, Any] = {
        "effective_max_running_requests": None,
        "requested": _count((info or {}).get("max_running_requests")),
        "source": None,
        "note": None,
    }
    if not info:
        capacity["note"] = "/server_info did not answer"
        return capacity
    value = _count((_first_state(info) or {}).get(CAPACITY_KEY))
    if value is None:
        capacity["note"] = f"/server_info has no internal_states[0].{CAPACITY_KEY}"
        return capacity
    capacity.update(effective_max_running_requests=value, source=CAPACITY_SOURCE)
    dp_size = _count(info.get("dp_size"))
    if dp_size is not None and dp_size > 1:
        capacity["note"] = f"per data-parallel rank (dp_size {dp_size})"
    return capacity


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
