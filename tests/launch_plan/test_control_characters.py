"""Control characters never reach a unit: the launch plan refuses them, naming the input they came
from (a model's config.json from a hub is not trusted), and the systemd filters refuse them too."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from deploytools.systemd_unit import systemd_env_line, systemd_exec_lines, systemd_quote

INJECTION = "\nExecStartPre=+/usr/bin/touch /tmp/pwned\n"


def _refusal(launch_plan: Any, config: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(launch_plan.PlanError) as err:
        launch_plan.build_plan(config, **kwargs)
    return str(err.value)


def test_a_config_json_string_with_a_newline_is_refused_naming_the_field(launch_plan, qwen_config, ct129_kwargs):
    config = copy.deepcopy(qwen_config)
    config["architectures"] = ["Qwen3_5ForConditionalGeneration" + INJECTION]
    message = _refusal(launch_plan, config, **ct129_kwargs)
    assert message.startswith("a note of the plan holds the control character '\\n'")
    assert "it comes from the model's config.json['architectures'][0]; remove it there" in message


def test_the_drafters_config_json_is_named_as_such(launch_plan, qwen_config, ct129_kwargs):
    """A string from the drafter's config.json is named as the drafter's, not the model's."""
    plan = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    draft = {"architectures": ["X" + INJECTION]}
    origins = {"the model's config.json": qwen_config, "the drafter's config.json": draft}
    tampered = dict(plan, notes=[*plan["notes"], "drafter X" + INJECTION])
    with pytest.raises(launch_plan.PlanError, match=r"from the drafter's config.json\['architectures'\]\[0\]"):
        launch_plan._refuse_control_characters(tampered, origins)


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("environment", {"EXTRA": "a\rb"}, "the environment variable EXTRA holds the control character '\\r'"),
        ("overrides", {"--served-model-name": "qwen" + INJECTION}, "argument "),
    ],
)
def test_operator_inputs_with_control_characters_are_refused(
    launch_plan, qwen_config, ct129_kwargs, field, value, named
):
    message = _refusal(launch_plan, qwen_config, **dict(ct129_kwargs, **{field: value}))
    assert message.startswith(named)
    key = next(iter(value))
    assert f"it comes from inference_server_{field}[{key!r}]" in message


def test_plans_without_control_characters_are_unchanged(launch_plan, qwen_config, ct129_kwargs):
    plan = launch_plan.build_plan(qwen_config, **ct129_kwargs)
    assert not any(launch_plan.CONTROL_CHARACTERS.search(str(word)) for word in plan["argv"])


@pytest.mark.parametrize(
    "value", ["a\nExecStartPre=+/usr/bin/touch /tmp/pwned\nY=", "tab\there", "bell\x07", "del\x7f"]
)
def test_the_systemd_filters_refuse_control_characters(value):
    with pytest.raises(ValueError, match="holds a control character"):
        systemd_env_line("X", value)
    with pytest.raises(ValueError, match="holds a control character"):
        systemd_quote(value)
    with pytest.raises(ValueError, match="holds a control character"):
        systemd_exec_lines(["/bin/engine", "--flag", value])
    # The same text without the control character renders as before.
    assert systemd_env_line("X", "a b") == 'Environment="X=a b"'
