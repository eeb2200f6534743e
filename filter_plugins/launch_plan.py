"""Ansible filters ``launch_plan`` (documented in launch_plan.yml), ``memory_budget`` and ``root_only_environment``.

The plan and the budget are the package ``deploytools.launch_plan`` (tools/deploytools, installed in
the controller's venv by ``make setup``); these filters turn its refusals into
AnsibleFilterError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from deploytools.launch_plan.budget import Launch, compute_budget, geometry
from deploytools.launch_plan.common import root_only_environment
from deploytools.launch_plan.errors import PlanError
from deploytools.launch_plan.plan import build_plan


def launch_plan(model_config: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The arguments of :func:`build_plan`, refusals as AnsibleFilterError."""
    try:
        return build_plan(model_config, **kwargs)
    except PlanError as err:
        raise AnsibleFilterError(str(err)) from None
    except TypeError as err:  # a missing or misspelt keyword argument
        raise AnsibleFilterError(f"launch_plan: {err}") from None


def memory_budget(model_config: Mapping[str, Any], **launch: Any) -> dict[str, Any]:
    """The budget of one launch (keyword arguments: the fields of :class:`Launch`)."""
    try:
        return compute_budget(geometry(model_config), Launch(**launch)).as_dict()
    except (TypeError, PlanError) as err:  # an unknown keyword, or rules= naming no set of rules
        raise AnsibleFilterError(f"memory_budget: {err}") from None


class FilterModule:
    """Ansible filters for the inference server's launch plan and its memory budget."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """Map filter names to functions."""
        return {
            "launch_plan": launch_plan,
            "memory_budget": memory_budget,
            # The plan's env for the engine's check, which root runs (tasks/validate.yml).
            "root_only_environment": root_only_environment,
        }
