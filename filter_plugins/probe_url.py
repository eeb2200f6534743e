"""Ansible filters for where the host probes its own server (readiness, watchdog, gate) and where
the engine listens behind the API front.

The code is ``deploytools.probe_url`` (tools/deploytools, installed in the controller's venv).
"""

from __future__ import annotations

from typing import Any

from deploytools.probe_url import (
    engine_bind,
    engine_port,
    engine_url,
    front_scheme,
    front_url,
    fronted,
    is_loopback,
    is_wildcard,
    local_api,
    probe_url,
)


class FilterModule:
    """Ansible filters for the URL the host's own probes use."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {
            "probe_url": probe_url,
            "fronted": fronted,
            "front_url": front_url,
            "front_scheme": front_scheme,
            "is_loopback": is_loopback,
            "is_wildcard": is_wildcard,
            "engine_bind": engine_bind,
            "engine_port": engine_port,
            "engine_url": engine_url,
            "local_api": local_api,
        }
