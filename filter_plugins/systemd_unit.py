"""Ansible filters that render an argv and an environment into systemd unit syntax.

The code is ``deploytools.systemd_unit`` (tools/deploytools, installed in the controller's venv).
"""

from __future__ import annotations

from typing import Any

from deploytools.systemd_unit import systemd_env_line, systemd_exec_lines, systemd_quote, systemd_text


class FilterModule:
    """Ansible filters for rendering systemd units."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {
            "systemd_quote": systemd_quote,
            "systemd_exec_lines": systemd_exec_lines,
            "systemd_env_line": systemd_env_line,
            "systemd_text": systemd_text,
        }
