"""Per-site ``for:`` durations of alert rules.

``{{ lookup('file', 'rules/llm-deploy.rules.yml') | monitoring_alert_for({'LLMGatewayDown': '5m'}) }}``
is the rule file with that alert's ``for:`` replaced (the expression, labels and runbook text
untouched); with no override the text comes back unchanged, comments included.
``monitoring_alert_names`` lists the alerts a rule file defines, for the role's input check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml


def _alert_rules(rules: Any) -> list[dict[str, Any]]:
    """The alerting rules (those with ``alert:``) of a parsed rule file."""
    groups = (rules or {}).get("groups") or [] if isinstance(rules, dict) else []
    return [
        rule
        for group in groups
        if isinstance(group, dict)
        for rule in group.get("rules") or []
        if isinstance(rule, dict) and "alert" in rule
    ]


def monitoring_alert_names(text: str) -> list[str]:
    """The alert names a Prometheus rule file (YAML text) defines, in file order."""
    return [str(rule["alert"]) for rule in _alert_rules(yaml.safe_load(text))]


def monitoring_alert_for(text: str, overrides: Mapping[str, str] | None) -> str:
    """``text`` (a rule file) with each alert named in ``overrides`` pending for that duration."""
    if not overrides:
        return text
    rules = yaml.safe_load(text)
    touched = False
    for rule in _alert_rules(rules):
        if rule["alert"] in overrides:
            rule["for"] = str(overrides[rule["alert"]])
            touched = True
    if not touched:
        return text
    return yaml.safe_dump(rules, sort_keys=False, width=120, allow_unicode=True)


class FilterModule:
    """The monitoring role's rule-file filters."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {"monitoring_alert_for": monitoring_alert_for, "monitoring_alert_names": monitoring_alert_names}
