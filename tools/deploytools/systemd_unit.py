"""Render values into systemd unit and environment-file syntax (the filters of filter_plugins/systemd_unit.py).

Every text that enters a unit or an environment file of the project goes through one of these
functions, and each refuses, with one sentence naming the variable the value came from, a value
that would break a line or mean something else to systemd:

* ``systemd_text(value, what, kind)``: a plain setting or a comment (``User=``, ``After=``,
  ``ReadWritePaths=``, ``IPAddressAllow=``, ``# Model: ...``), checked as the ``kind`` of value
  it must be (``KINDS``: text, setting, account, unit, unit_name, path, address, device,
  limit_name, limit);
* ``systemd_quote(word, what)`` and ``systemd_exec_lines(argv, what)``: an ``ExecStart=`` command
  line, each word quoted for systemd;
* ``systemd_env_line(name, value, what)``: one ``Environment=`` assignment;
* ``systemd_env_file_line(name, value, what)`` and ``systemd_env_file(mapping, what)``: a line, and
  the lines of a mapping, of an ``EnvironmentFile=`` (a value is never shown in a refusal: those
  files hold secrets).

No control character passes (a newline would start a new unit line), and names and words are
checked with a full match (``re.fullmatch``; ``$`` would accept a trailing newline).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any, NamedTuple

# Characters that are safe unquoted in a systemd command line word and in an environment file's value.
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
# A newline would start a new unit line; no control character belongs in a unit's value
# (the launch plan refuses them with the same pattern).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
# An environment variable's name, as systemd and the shells accept it.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The resource limits systemd sets (systemd.exec(5), "Process Properties").
_LIMITS = "CPU|FSIZE|DATA|STACK|CORE|RSS|NOFILE|AS|NPROC|MEMLOCK|LOCKS|SIGPENDING|MSGQUEUE|NICE|RTPRIO|RTTIME"
_LIMIT_VALUE = r"(infinity|[0-9]+[A-Za-z]*)"
_UNIT_TYPES = "service|socket|device|mount|automount|swap|target|path|timer|slice|scope"


class Kind(NamedTuple):
    """What a value of one kind must be: ``valid`` says whether a text is one, ``must_be`` says
    so in words for the refusal, ``escape_percent`` whether systemd expands ``%`` specifiers there."""

    valid: Callable[[str], bool]
    must_be: str
    escape_percent: bool


def _matches(pattern: str) -> Callable[[str], bool]:
    """A full match of ``pattern`` (never a prefix, never before a trailing newline)."""
    compiled = re.compile(pattern)
    return lambda text: compiled.fullmatch(text) is not None


def _ip_address_allow_entry(text: str) -> bool:
    """An entry of IPAddressAllow=: an address or CIDR prefix, or one of systemd's names for a range."""
    if text in ("any", "localhost", "link-local", "multicast"):
        return True
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


KINDS: dict[str, Kind] = {
    # A comment line: anything printable.
    "text": Kind(lambda text: True, "", False),
    # A free-text setting such as Description=, where systemd expands % specifiers.
    "setting": Kind(lambda text: True, "", True),
    "account": Kind(
        _matches(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}"),
        "no user or group name (a letter or _, then letters, digits and _.-, at most 32 characters)",
        False,
    ),
    "unit": Kind(
        _matches(rf"[A-Za-z0-9:_.@-]+\.({_UNIT_TYPES})"),
        "no systemd unit name (letters, digits and :_.@-, then its type, such as nvidia-persistenced.service)",
        False,
    ),
    "unit_name": Kind(
        _matches(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"),
        "no name for a unit and its directories (letters, digits and _.-, not starting with . or -)",
        False,
    ),
    "path": Kind(
        _matches(r"/[^\s\"'\\]*"),
        "no absolute path without whitespace, quotes or backslashes",
        True,
    ),
    "address": Kind(
        _ip_address_allow_entry,
        "no IP address or CIDR prefix (such as 10.0.4.17 or 10.0.4.0/24) nor one of any, localhost, link-local, "
        "multicast",
        False,
    ),
    "device": Kind(
        _matches(r"/dev/[A-Za-z0-9_.:+/-]+|(char|block)-[A-Za-z0-9_.:+-]+"),
        "no device node (/dev/...) nor driver group (char-<name> or block-<name> of /proc/devices)",
        False,
    ),
    "limit_name": Kind(_matches(rf"Limit({_LIMITS})"), f"no resource limit of systemd (Limit{{{_LIMITS}}})", False),
    "limit": Kind(
        _matches(rf"{_LIMIT_VALUE}(:{_LIMIT_VALUE})?"),
        "no resource limit (a number, infinity, or soft:hard such as 1024:65536)",
        False,
    ),
}


def _no_control_characters(text: str, what: str) -> str:
    """Return ``text``, or raise ValueError when it holds a control character (the launch plan
    refuses these first, naming their source; this is the renderer's own guard)."""
    if CONTROL_CHARACTERS.search(text):
        raise ValueError(
            f"{what} {text[:80]!r} holds a control character, which would break the lines of a systemd unit: remove it"
        )
    return text


def systemd_text(value: Any, what: str, kind: str = "text") -> str:
    """``value`` as text for a comment or a plain setting of a unit, checked as a ``kind`` of value
    (``KINDS``); refused with a control character or when it is not one, naming ``what`` (the
    variable it came from). Where systemd expands ``%`` specifiers, ``%`` becomes ``%%``.

    >>> systemd_text("Qwen3.6-27B", "model_sync_name")
    'Qwen3.6-27B'
    >>> systemd_text("/srv/100%", "inference_server_state_dir", "path")
    '/srv/100%%'
    """
    if kind not in KINDS:
        raise ValueError(f"systemd_text knows no kind {kind!r} (one of {', '.join(KINDS)})")
    text = _no_control_characters(str(value), what)
    check = KINDS[kind]
    if not check.valid(text):
        raise ValueError(f"{what} holds {text[:80]!r}, which is {check.must_be}: correct it")
    return text.replace("%", "%%") if check.escape_percent else text


def systemd_quote(word: Any, what: str = "the argument") -> str:
    """Quote one word for an ExecStart= line.

    ``$`` becomes ``$$`` (no variable expansion) and ``%`` becomes ``%%`` (no unit
    specifiers), so the process receives exactly ``word``.
    """
    text = _no_control_characters(str(word), what)
    escaped = text.replace("%", "%%").replace("$", "$$")
    if _SAFE_WORD.fullmatch(text):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def systemd_exec_lines(argv: list[Any], what: str = "the argument") -> list[str]:
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
        lines[-1].append(systemd_quote(word, what))
    return [" ".join(words) for words in lines]


def _env_name(name: Any, what: str) -> str:
    """``name`` when it is an environment variable's name (a full match), else ValueError naming ``what``."""
    text = str(name)
    if not _ENV_NAME.fullmatch(text):
        raise ValueError(
            f"{what} holds the name {text[:80]!r}, which is no environment variable name (a letter or _, then "
            "letters, digits and _): correct it"
        )
    return text


def systemd_env_line(name: Any, value: Any, what: str = "the environment") -> str:
    """Render ``Environment="NAME=value"`` with systemd's quoting rules."""
    key = _env_name(name, what)
    text = _no_control_characters(str(value), f"the value of {key} in {what}")
    text = text.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{key}={text}"'


def systemd_env_file_line(name: Any, value: Any, what: str) -> str:
    """Render one ``NAME=value`` line of an EnvironmentFile= (systemd.exec(5); a shell reads it alike).

    A value of safe characters stays as it is; any other is double-quoted, with ``\\``, ``"``,
    ``$`` and `````` escaped by a backslash, which systemd's parser and a shell both take back.
    A control character is refused (a newline would add a variable, such as LD_PRELOAD), naming
    the variable and the name but never the value, which is a secret.

    >>> systemd_env_file_line("TOKEN", "a b$c", "inference_server_secrets")
    'TOKEN="a b\\\\$c"'
    """
    key = _env_name(name, what)
    text = str(value)
    if CONTROL_CHARACTERS.search(text):
        raise ValueError(
            f"the value of {key} in {what} holds a control character, which would start a new line of its "
            "environment file: remove it"
        )
    if _SAFE_WORD.fullmatch(text):
        return f"{key}={text}"
    escaped = re.sub(r'([\\"$`])', r"\\\1", text)
    return f'{key}="{escaped}"'


def systemd_env_file(mapping: dict[str, Any], what: str) -> str:
    """The lines of an EnvironmentFile= for ``mapping`` (sorted by name, each ended by a newline), as
    :func:`systemd_env_file_line` renders and refuses them.

    >>> systemd_env_file({"B": "2", "A": "x y"}, "inference_server_secrets")
    'A="x y"\\nB=2\\n'
    """
    return "".join(systemd_env_file_line(name, value, what) + "\n" for name, value in sorted(mapping.items()))
