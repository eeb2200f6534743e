"""Render an argv and an environment into systemd unit syntax (the filters of filter_plugins/systemd_unit.py).

``systemd_exec_lines`` turns an argv into ExecStart= continuation lines, one flag and its
value(s) per line, each word quoted for systemd. ``systemd_quote`` quotes one word, and
``systemd_env_line`` renders one ``Environment=`` assignment and ``systemd_text`` checks the text of
a comment line or a plain setting. Each refuses a control character (a newline would start a new
unit line), naming where the value came from.
"""

from __future__ import annotations

import re
from typing import Any

# Characters that are safe unquoted in a systemd command line word.
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
# A newline would start a new unit line; no control character belongs in a unit's value
# (the launch plan refuses them with the same pattern).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")


def _no_control_characters(text: str, what: str) -> str:
    """Return ``text``, or raise ValueError when it holds a control character (the launch plan
    refuses these first, naming their source; this is the renderer's own guard)."""
    if CONTROL_CHARACTERS.search(text):
        raise ValueError(f"{what} {text[:80]!r} holds a control character: it cannot go into a systemd unit")
    return text


def systemd_text(value: Any, what: str) -> str:
    """``value`` as text for a comment or a plain setting of a unit (``# Model: ...``,
    ``Description=``); refused with a control character, naming ``what`` (the variable it came from).

    >>> systemd_text("Qwen3.6-27B", "model_sync_name")
    'Qwen3.6-27B'
    """
    return _no_control_characters(str(value), what)


def systemd_quote(word: Any) -> str:
    """Quote one word for an ExecStart= line.

    ``$`` becomes ``$$`` (no variable expansion) and ``%`` becomes ``%%`` (no unit
    specifiers), so the process receives exactly ``word``.
    """
    text = _no_control_characters(str(word), "the argument")
    escaped = text.replace("%", "%%").replace("$", "$$")
    if text and _SAFE_WORD.match(text):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def systemd_exec_lines(argv: list[Any]) -> list[str]:
    """Group an argv into lines: the program and its leading words, then one flag per line.

    >>> systemd_exec_lines(["/v/bin/sglang", "serve", "--port", "30000", "--trust-remote-code"])
    ['/v/bin/sglang serve', '--port 30000', '--trust-remote-code']
    """
    if not argv:
        raise ValueError("systemd_exec_lines needs a non-empty argv")
    lines: list[list[str]] = [[]]
    for word in map(str, argv):
        if word.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(systemd_quote(word))
    return [" ".join(words) for words in lines]


def systemd_env_line(name: str, value: Any) -> str:
    """Render ``Environment="NAME=value"`` with systemd's quoting rules."""
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(name)):
        raise ValueError(f"'{name}' is not a valid environment variable name")
    text = _no_control_characters(str(value), f"the value of {name}")
    text = text.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{name}={text}"'
