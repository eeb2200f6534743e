# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The prompts a gate sends: the built-in fallback and the loader of the ``prompts`` option."""

from __future__ import annotations

from typing import Any

from .errors import GateUsageError, read_json_option

# Used when no prompts are given (ad-hoc module use); the role ships files/prompts.json.
FALLBACK_PROMPTS: list[dict[str, Any]] = [
    {
        "id": "fallback-log-parser",
        "messages": [
            {
                "role": "user",
                "content": (
                    "Write a Python function that reads an nginx access log and returns the ten client "
                    "IP addresses with the most 5xx responses. Use type hints and a docstring, then add "
                    "a short pytest test for it."
                ),
            }
        ],
    },
    {
        "id": "fallback-lru-cache",
        "messages": [
            {
                "role": "user",
                "content": (
                    "Implement an LRU cache class in Python with get and put in O(1), without using "
                    "functools. Explain the data structures you chose."
                ),
            }
        ],
    },
]


def load_prompts(value: Any) -> list[dict[str, Any]]:
    """Turn a prompts option into ``[{"id": str, "messages": [...]}, ...]``.

    Accepts ``None`` (built-in fallback), a path to a JSON file holding a list or
    ``{"prompts": [...]}``, or a list. Each prompt is a string (one user message) or a
    mapping with ``messages`` (OpenAI chat format) and an optional ``id``.
    """
    if value is None or value == "" or value == []:
        return [dict(p) for p in FALLBACK_PROMPTS]
    value, source = read_json_option(value, "prompts")
    if isinstance(value, dict) and "prompts" in value:
        value = value["prompts"]
    if not isinstance(value, list) or not value:
        raise GateUsageError(f"{source} must be a non-empty list of prompts")
    prompts: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item.strip():
            prompts.append({"id": f"prompt-{index}", "messages": [{"role": "user", "content": item}]})
            continue
        if isinstance(item, dict) and isinstance(item.get("messages"), list) and item["messages"]:
            ok = all(
                isinstance(m, dict) and m.get("role") and isinstance(m.get("content"), str) for m in item["messages"]
            )
            if ok:
                prompts.append({"id": str(item.get("id") or f"prompt-{index}"), "messages": item["messages"]})
                continue
        raise GateUsageError(
            f"{source}: prompt {index} must be a string or a mapping with a messages list of {{role, content}}"
        )
    return prompts
