"""The gate's rules in one place: the module's option check and the role's preflight use RANGE_RULES.

The preflight (roles/health_gate/tasks/preflight.yml) applies the filter health_gate_problems
(filter_plugins/health_gate.py) to the role's variables before anything changes; these tests
hold the two uses to one table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gate_fakes import CONTROLLER_BIN, REPO, ROLE, llm_gate

PREFLIGHT = ROLE / "tasks" / "preflight.yml"


def below(rule: llm_gate.config.RangeRule) -> float:
    """The nearest value that breaks ``rule``."""
    return rule.low if rule.strict else rule.low - 1


@pytest.mark.parametrize("rule", llm_gate.RANGE_RULES, ids=lambda rule: rule.key)
def test_module_and_preflight_refuse_the_same_values(rule: llm_gate.config.RangeRule) -> None:
    bad, good = below(rule), rule.low + 1
    with pytest.raises(llm_gate.GateUsageError, match=rule.key):
        llm_gate.GateConfig.from_options({rule.key: bad})
    assert llm_gate.GateConfig.from_options({rule.key: good})
    assert llm_gate.variable_problems({rule.key: str(bad)}, "health_gate_") == [
        f"health_gate_{rule.key} is {bad}, but it must be {rule.must}"
    ]
    assert llm_gate.variable_problems({rule.key: good}, "health_gate_") == []


def test_preflight_reads_whole_numbers_and_urls_as_the_gate_does() -> None:
    problems = llm_gate.variable_problems({"requests": "2.5", "url": "ftp://host", "max_tokens": "many"}, "v_")
    assert problems == [
        "v_url is ftp://host, but it must be a URL starting with http:// or https://",
        "v_requests is 2.5, but it must be a whole number, at least 1 measured request",
        "v_max_tokens is many, but it must be a whole number, at least 2 (decode speed needs two tokens)",
    ]
    with pytest.raises(llm_gate.GateUsageError, match="requests must be an integer"):
        llm_gate.GateConfig.from_options({"requests": 2.5})


def test_preflight_checks_every_role_variable_that_has_a_rule() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    ruled = {rule.key for rule in llm_gate.RANGE_RULES} | {"url", *llm_gate.CHOICE_OPTIONS}
    with_variable = {key for key in ruled if f"health_gate_{key}" in defaults}
    task = yaml.safe_load(PREFLIGHT.read_text())[0]
    values = task["vars"]["_health_gate_values"]
    assert set(values) == with_variable
    assert all(values[key] == f"{{{{ health_gate_{key} }}}}" for key in values)


def run_preflight(tmp_path: Path, *extra: str) -> dict:
    """Run the role's preflight entry point on localhost; the JSON callback's task results."""
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.import_role: {name: health_gate, tasks_from: preflight.yml}\n"
    )
    env = {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{CONTROLLER_BIN}:/usr/bin:/bin",
    }
    out = subprocess.run(
        [str(CONTROLLER_BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook), *extra],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    tasks = json.loads(out.stdout)["plays"][0]["tasks"]
    return {task["task"]["name"].removeprefix("health_gate : "): task["hosts"]["localhost"] for task in tasks}


def test_role_preflight_refuses_with_one_sentence_per_variable_and_changes_nothing(tmp_path: Path) -> None:
    python = ["-e", f"ansible_python_interpreter={sys.executable}"]
    results = run_preflight(tmp_path, *python, "-e", "health_gate_requests=0", "-e", "health_gate_min_decode_tps=-5")
    refusal = results["Check that the gate's limits and thresholds make sense"]
    assert refusal["failed"] is True
    assert refusal["msg"] == (
        "health_gate_requests is 0, but it must be at least 1 measured request: correct it in the group_vars or "
        "host_vars that set it. health_gate_min_decode_tps is -5, but it must be 0 (no check) or positive "
        "(tokens/s): correct it in the group_vars or host_vars that set it."
    )
    passed = run_preflight(tmp_path, *python, "--check")
    assert passed["Check that the gate's limits and thresholds make sense"].get("failed") is not True
