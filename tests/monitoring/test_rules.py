"""roles/monitoring's alert rules: promtool's own checks and unit tests, and every alert covered.

tests/monitoring/rules.test.yml holds promtool unit tests (synthetic series; for each alert a
time it fires at and one it does not) without annotations; the test fills each expected
alert's annotations in from its rule, substituting ``{{ $labels.X }}`` with the expected labels,
and runs ``promtool test rules`` (Prometheus 2.42 from Debian's package, tools/fetch-prometheus).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from monitoring_support import RULES, promtool, rules

HERE = Path(__file__).resolve().parent
CASES = HERE / "rules.test.yml"


def _annotations(rule: dict, labels: dict[str, str]) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for an alert with ``labels``."""

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)

    assert "$value" not in str(rule["annotations"]), f"{rule['alert']}: keep $value out (see the module docstring)"
    return {name: fill(text) for name, text in rule["annotations"].items()}


def _write_cases(tmp_path: Path) -> Path:
    """rules.test.yml with its annotations filled in, beside a copy of the rules."""
    by_name = {rule["alert"]: rule for rule in rules()}
    cases = yaml.safe_load(CASES.read_text())
    for test in cases["tests"]:
        for check in test["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                alert["exp_annotations"] = _annotations(by_name[check["alertname"]], alert["exp_labels"])
    shutil.copy(RULES, tmp_path / RULES.name)
    out = tmp_path / "rules.test.yml"
    out.write_text(yaml.safe_dump(cases, sort_keys=False))
    return out


def test_promtool_checks_the_rules():
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_every_alert_has_a_for_a_severity_and_a_runbook():
    for rule in rules():
        assert "for" in rule, f"{rule['alert']} has no for:"
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert len(rule["annotations"]["runbook"]) > 80 and rule["annotations"]["summary"], rule["alert"]


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests():
    cases = yaml.safe_load(CASES.read_text())
    fired, quiet = set(), set()
    for test in cases["tests"]:
        for check in test["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in rules()}
    assert names - fired == set(), f"alerts never shown firing: {sorted(names - fired)}"
    assert names - quiet == set(), f"alerts never shown quiet: {sorted(names - quiet)}"


def test_promtool_unit_tests_pass(tmp_path):
    cases = _write_cases(tmp_path)
    proc = subprocess.run([promtool(), "test", "rules", str(cases)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_can_fail(tmp_path):
    """A rule changed under the tests (a threshold) makes promtool fail: the tests do judge."""
    cases = _write_cases(tmp_path)
    rules_copy = tmp_path / RULES.name
    text = rules_copy.read_text()
    assert "sglang:token_usage) > 0.95" in text
    rules_copy.write_text(text.replace("sglang:token_usage) > 0.95", "sglang:token_usage) > 0.99"))
    proc = subprocess.run([promtool(), "test", "rules", str(cases)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "LLMKVCacheNearlyFull" in proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["LLMServerDown", "LLMGateStale"])
def test_annotation_filling_names_the_host(name):
    rule = next(rule for rule in rules() if rule["alert"] == name)
    filled = _annotations(rule, {"host": "gpu-a01", "instance": "gpu-a01:30000", "job": "sglang"})
    assert "gpu-a01" in filled["summary"] and "$labels" not in str(filled)
