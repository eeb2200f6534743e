"""A compact JSON encoder for the command line's output.

Kept instead of ``json.dumps`` for start-up time: ``import json`` pulls in ``re`` and costs
about 9 ms under ``python3 -IS``, as much as the whole rest of a no-op ``model-sync deploy``
(about 10 ms; ``bench/model_sync``'s no-op row). The Ansible module does not use it (AnsibleModule
has imported ``json`` already). tests/model_sync/test_model_sync_engine.py checks it against ``json``.
"""

from __future__ import annotations

_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n", ord("\t"): "\\t"})


def dumps(obj: object) -> str:
    """Serialise plain data (dict, list, tuple, str, int, float, bool, None) as compact JSON.

    Keys sorted, no spaces, non-ASCII kept as is, NaN and infinities as ``null``; anything
    else as its ``str``.
    """
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, str):
        return '"' + obj.translate(_ESCAPES) + '"'
    if isinstance(obj, (int, float)):
        return repr(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else "null"
    if isinstance(obj, dict):
        items = sorted(obj.items(), key=lambda kv: str(kv[0]))
        return "{" + ",".join(dumps(str(k)) + ":" + dumps(v) for k, v in items) + "}"
    if isinstance(obj, (list, tuple, set, frozenset)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return dumps(str(obj))
