"""The launch settings, one role variable each (issue 45): an operator sets one of them from -e,
host_vars or group_vars and the profile's others stay; the plan's refusals name that variable, and
the whole-dictionary form that replaced every setting at once is refused, naming what to set instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from deploytools.launch_plan.common import SETTINGS
from deploytools.launch_plan_cli import argv_flags
from launch_plan_cases import launch_plan_tool, load_yaml
from role_files import run_role_tasks

ROLE = "roles/inference_server"
# The whole-dictionary form's refusal, as tools/launch-plan and a deploy's precheck print it.
WHOLE_DICTIONARY_REFUSAL = (
    "inference_server_settings is no longer read: set each of its keys as a variable of its own, with the same "
    "value, where it is set (inference_server_target_concurrency, inference_server_dtype; docs/launch-plan.md, "
    '"Settings").'
)


def planned_flags(*args: str) -> dict[str, str]:
    """``--flag value`` of ct129's plan by tools/launch-plan with ``args`` (it must plan)."""
    proc = launch_plan_tool("ct129", "--json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return argv_flags(json.loads(proc.stdout)["plan"]["argv"])


def changed(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """The flags whose value differs: flag -> (before, after)."""
    return {
        f: (before.get(f), after.get(f)) for f in sorted(before.keys() | after.keys()) if before.get(f) != after.get(f)
    }


def test_each_setting_is_a_documented_role_variable_composed_in_one_place():
    """Every setting of the plan's table is inference_server_<key>: unset (null) in defaults/main.yml,
    documented with its type in meta/argument_specs.yml (which the converged fingerprint reads, so a
    changed setting leaves the fast path), and composed once, in vars/main.yml, into the filter's mapping."""
    defaults = load_yaml(f"{ROLE}/defaults/main.yml")
    options = load_yaml(f"{ROLE}/meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    composed = load_yaml(f"{ROLE}/vars/main.yml")["_inference_server_settings"]
    assert list(composed) == [s.key for s in SETTINGS]
    for setting in SETTINGS:
        assert setting.variable in defaults and defaults[setting.variable] is None, setting.variable
        assert options[setting.variable]["type"] == setting.kind, setting.variable
        assert composed[setting.key] == "{{ " + setting.variable + " }}", setting.key
    assert "inference_server_settings" not in defaults and "inference_server_settings" not in options


def test_one_setting_from_the_command_line_keeps_the_profiles_others():
    """The issue's try-out, `tools/launch-plan ct129 -e inference_server_target_concurrency=6`: TP 2,
    NEXTN 3/1/4, metrics and the rest of sglang_servers stay; only what the budget derives from the
    running requests moves. The same with two settings, one of which the budget needs for the other."""
    profile = planned_flags()
    assert changed(profile, planned_flags("-e", "inference_server_target_concurrency=6")) == {
        "--context-length": ("118784", "107520"),
        "--max-running-requests": ("4", "6"),
    }
    both = planned_flags(
        "-e", "inference_server_target_concurrency=8", "-e", "inference_server_mem_fraction_static=0.73"
    )
    assert changed(profile, both) == {
        "--context-length": ("118784", "108544"),
        "--max-running-requests": ("4", "8"),
        "--mem-fraction-static": ("0.717", "0.73"),
    }


def test_a_refusal_names_the_variable_set_alone():
    """Set alone, 8 running requests do not fit ct129's default fraction: the budget's refusal names
    inference_server_target_concurrency and what to change (not the tensor-parallel refusal that the
    whole dictionary's -e used to cause by dropping the profile's TP 2)."""
    proc = launch_plan_tool("ct129", "-e", "inference_server_target_concurrency=8")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "launch-plan: ct129: inference_server_target_concurrency is 8, but the memory budget per GPU "
        "(--mem-fraction-static 0.717 (the plan: SGLang's own default for this GPU), --max-running-requests 8 (the "
        "plan: inference_server_target_concurrency)) holds only 7 running requests (37 mamba slots at 5 per "
        "request): lower inference_server_target_concurrency to 7 or raise inference_server_mem_fraction_static to "
        "at least 0.726."
    )


def test_text_of_key_value_extra_vars_is_read_as_each_settings_kind(launch_plan, qwen_config, ct129_kwargs):
    """`-e name=value` hands every value over as text: the profile's settings as text plan the same."""
    as_text = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in ct129_kwargs["settings"].items()}
    assert as_text["tensor_parallel_size"] == "2" and as_text["trust_remote_code"] == "true"
    assert launch_plan.build_plan(qwen_config, **dict(ct129_kwargs, settings=as_text)) == launch_plan.build_plan(
        qwen_config, **ct129_kwargs
    )


def test_the_whole_dictionary_is_refused_by_the_tool():
    extra = json.dumps({"inference_server_settings": {"target_concurrency": 8, "dtype": "bfloat16"}})
    proc = launch_plan_tool("ct129", "-e", extra)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == f"launch-plan: ct129: {WHOLE_DICTIONARY_REFUSAL}"


def test_the_whole_dictionary_is_refused_by_a_deploys_precheck_before_the_plan_can_be_checked(tmp_path: Path):
    """deploy.yml's precheck refuses it too, before anything changes on the host, also for a model
    whose config.json only the sync can read (no model_sync_source_config: the plan itself waits)."""
    extra = {"inference_server_settings": {"target_concurrency": 8, "dtype": "bfloat16"}}
    proc = run_role_tasks(tmp_path, extra, ["precheck.yml"], check_mode=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    flat = " ".join(proc.stdout.split())
    assert "fatal: [localhost]" in flat and flat.count("fatal:") == 1
    assert "TASK [inference_server : Refuse inference_server_settings, which one variable per setting replaced]" in flat
    assert WHOLE_DICTIONARY_REFUSAL in flat
