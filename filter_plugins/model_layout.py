"""Ansible filters for where model_sync serves a model from on the host.

The code is ``deploytools.model_layout`` (tools/deploytools, installed in the controller's venv).
"""

from __future__ import annotations

from typing import Any

from deploytools.model_layout import model_current_link, model_serving_path


class FilterModule:
    """Ansible filters for model_sync's layout on the host."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {"model_current_link": model_current_link, "model_serving_path": model_serving_path}
