# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Redaction: no API key leaves the gate, not in a quoted journal nor in the report."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_KEY_PATTERN = re.compile(
    r"""(api[_-]?key['"]?\s*[=:]\s*|--api-key[=\s]+|Bearer\s+)(['"]?)([^'"\s,)]+)""", re.IGNORECASE
)


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """Hide ``secrets`` and anything that looks like ``api_key=...`` or a Bearer token.

    SGLang logs its server arguments (api_key included) at start-up and echoes them in
    ``/server_info``; a journal quoted as evidence must not leak the key.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _KEY_PATTERN.sub(
        lambda m: m.group(1) + m.group(2) + ("***" if m.group(3) not in ("None", "null", "") else m.group(3)), text
    )


def redact(obj: Any, secrets: Sequence[str]) -> Any:
    """Redact every string inside ``obj`` (dicts, lists) with :func:`redact_text`."""
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    return obj
