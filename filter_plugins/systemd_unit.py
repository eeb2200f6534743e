"""Ansible filters that render values into systemd unit and environment-file syntax.

The code is ``deploytools.systemd_unit`` (tools/deploytools, installed in the controller's venv):
every text that enters a unit or an environment file of the project goes through one of these.
"""

from __future__ import annotations

from typing import Any

from deploytools.systemd_unit import (
    systemd_env_file,
    systemd_env_file_line,
    systemd_env_line,
    systemd_exec_lines,
    systemd_quote,
    systemd_text,
)


class FilterModule:
    """Ansible filters for rendering systemd units and their environment files."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {
            "systemd_quote": systemd_quote,
            "systemd_exec_lines": systemd_exec_lines,
            "systemd_env_line": systemd_env_line,
            "systemd_env_file_line": systemd_env_file_line,
            "systemd_env_file": systemd_env_file,
            "systemd_text": systemd_text,
        }
