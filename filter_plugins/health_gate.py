"""Ansible filter for the health gate's preflight: its variables checked by the gate's own rules.

The rules are the gate's package ``llm_gate`` (module_utils of the repository's collection
llm_deploy.inference, found by Ansible's collection loader, and installed in the controller's venv by
make setup, pyproject.toml): the same table the module and the CLI
check their options with, applied here on the controller, before anything changes on the host.
"""

from __future__ import annotations

import json
from typing import Any

# llm_gate is imported where a filter is called, not here: a task's process that templates a filter
# loads every file of filter_plugins/, and Ansible's collection loader compiles the package's modules
# from source each time (it keeps no bytecode). Imported at the top, that cost about 1 of the 3.8
# CPU-seconds of playbooks/nightly.yml's play, which never calls these filters.


def health_gate_problems(values: dict[str, Any], prefix: str = "") -> list[str]:
    """One sentence per variable (``prefix`` + option name) whose value breaks the gate's rules.

    Raises ValueError for a key that is no gate option (a mistake in the task, not in the input).
    """
    from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate import DEFAULTS, variable_problems

    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"health_gate_problems: unknown gate options: {', '.join(unknown)}")
    return variable_problems(values, prefix)


def health_gate_probe_set_problems(text: str) -> list[str]:
    """What is wrong with a probe set's JSON text ('' when its file was not found); [] when it is right."""
    from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate import GateUsageError, load_probe_set

    if not text:
        return ["no such probe set was found"]
    try:
        load_probe_set(json.loads(text))
    except ValueError as exc:  # GateUsageError, or the JSON itself
        return [str(exc) if isinstance(exc, GateUsageError) else f"it is no JSON ({exc})"]
    return []


class FilterModule:
    """Ansible filters of the health gate's preflight."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {
            "health_gate_problems": health_gate_problems,
            "health_gate_probe_set_problems": health_gate_probe_set_problems,
        }
