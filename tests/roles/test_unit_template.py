"""The unit template refuses a control character in any text it writes unquoted (its comment lines,
Description=), naming the variable, and writes nothing (the role's real template, rendered by
ansible-playbook as a deploy renders it)."""

from __future__ import annotations

import pytest
from test_drain import render_unit, template_run


@pytest.mark.parametrize(
    "variable, value",
    [
        ("ml_env_engine_version", "5.6.0\nExecStartPre=+/usr/bin/touch /tmp/pwned"),
        ("model_sync_revision", "abc\rdef"),
        ("model_sync_name", "tiny\nUser=root"),
        ("model_sync_model_dir", "/srv/models/m\n[Service]"),
    ],
)
def test_a_control_character_in_a_comment_or_the_description_is_refused_naming_it(tmp_path, variable, value):
    proc = template_run(tmp_path, **{variable: value})
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert f"{variable} {value[:80]!r} holds a control character: it cannot go into a systemd unit" in out
    assert not (tmp_path / "unit").exists()


def test_a_note_with_a_newline_is_refused_as_a_note_of_the_plan(tmp_path):
    plan = {"argv": ["/opt/ml-env/bin/transformers", "serve"], "env": {}, "notes": ["model X\nExecStartPre=+/x"]}
    proc = template_run(tmp_path, inference_server_plan=plan)
    assert proc.returncode != 0
    assert "a note of the launch plan (inference_server_plan.notes)" in proc.stdout + proc.stderr
    assert not (tmp_path / "unit").exists()


def test_the_same_texts_without_control_characters_render(tmp_path):
    unit = render_unit(tmp_path, ml_env_engine_version="5.6.0", model_sync_revision="abc", model_sync_name="tiny")
    assert (
        "# Engine: transformers 5.6.0\n" in unit and "Description=LLM inference server (transformers, tiny)\n" in unit
    )
