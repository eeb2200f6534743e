"""Where model_sync puts a model on the host: the one derivation of its serving path.

model_sync keeps each artifact (the model, its drafter) under ``<root>/<name>/`` with its
revisions in ``revisions/<rev>`` and the served one behind the link ``<root>/<name>/current``,
switched atomically. A ``host_path`` source is used where it is, without that layout. The
places that need the path before the sync has run (inference_server's precheck, the offline
plan of tools/launch-plan), the last-known-good record and the gateway's revision lookup all
derive it here.
"""

from __future__ import annotations

from typing import Any


def model_current_link(source: dict[str, Any] | None, root: str, name: str) -> str:
    """The ``current`` link model_sync switches for ``source``; '' for a host_path source or none.

    >>> model_current_link({"type": "hub"}, "/srv/models/", "qwen")
    '/srv/models/qwen/current'
    >>> model_current_link({"type": "host_path", "path": "/data/qwen"}, "/srv/models", "qwen")
    ''
    """
    if not source or source.get("type") == "host_path":
        return ""
    if not root or not name:
        raise ValueError("model_current_link needs model_sync_root and the artifact's name")
    return f"{root.rstrip('/')}/{name}/current"


def model_serving_path(source: dict[str, Any] | None, root: str, name: str) -> str:
    """The directory the engine is pointed at: a host_path source's path, else its ``current`` link.

    '' when there is no source (no drafter set).

    >>> model_serving_path({"type": "host_path", "path": "/data/qwen"}, "/srv/models", "qwen")
    '/data/qwen'
    >>> model_serving_path({"type": "mirror", "host": "m"}, "/srv/models", "qwen")
    '/srv/models/qwen/current'
    >>> model_serving_path({}, "/srv/models", "draft")
    ''
    """
    if not source:
        return ""
    if source.get("type") == "host_path":
        return str(source.get("path", ""))
    return model_current_link(source, root, name)
