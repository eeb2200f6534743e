"""The systemd rendering filters: every argv survives systemd's own command-line parser."""

from __future__ import annotations

import shlex

import pytest
from deploytools.systemd_unit import systemd_env_line, systemd_exec_lines, systemd_quote


def systemd_split(line: str) -> list[str]:
    """Split an ExecStart= value the way systemd does for our quoting subset.

    systemd accepts C-style escapes inside double quotes and turns $$ into $ and %% into %.
    shlex in POSIX mode handles the double quotes and backslash escapes alike.
    """
    words = shlex.split(line, posix=True)
    return [w.replace("$$", "$").replace("%%", "%") for w in words]


@pytest.mark.parametrize(
    "argv",
    [
        [
            "/opt/ml-env.d/abc/bin/sglang",
            "serve",
            "--model-path",
            "/root/models/Qwen3.6-27B",
            "--speculative-num-steps",
            "3",
            "--trust-remote-code",
        ],
        [
            "/v/bin/python",
            "-m",
            "sglang.launch_server",
            "--served-model-name",
            'my model "x"',
            "--chat-template",
            "{% if a %}$HOME{% endif %}",
            "--api-key",
            "a\\b",
        ],
    ],
)
def test_exec_lines_round_trip_through_systemd_quoting(argv):
    lines = systemd_exec_lines(argv)
    assert systemd_split(" ".join(lines)) == argv


def test_one_flag_per_line_with_its_value():
    lines = systemd_exec_lines(["/b/sglang", "serve", "--port", "30000", "--trust-remote-code", "--tp", "2"])
    assert lines == ["/b/sglang serve", "--port 30000", "--trust-remote-code", "--tp 2"]


def test_positional_words_stay_with_the_program():
    lines = systemd_exec_lines(["/b/transformers", "serve", "/srv/models/m", "--port", "8000"])
    assert lines[0] == "/b/transformers serve /srv/models/m"


def test_dollar_and_percent_are_not_expanded():
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote("50%") == "50%%"


def test_env_line_rejects_bad_names():
    assert systemd_env_line("SGLANG_ENABLE_SPEC_V2", 1) == 'Environment="SGLANG_ENABLE_SPEC_V2=1"'
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        systemd_env_line("BAD-NAME", "x")


def test_empty_argv_is_refused():
    with pytest.raises(ValueError):
        systemd_exec_lines([])
