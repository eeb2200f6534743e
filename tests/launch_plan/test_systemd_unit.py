"""The systemd rendering filters: every argv survives systemd's own command-line parser, and every entry
point (the functions and the Ansible filter plugin) refuses a value that would break a line, naming it."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
from pathlib import Path

import pytest
from deploytools import systemd_unit
from deploytools.systemd_unit import systemd_env_line, systemd_exec_lines, systemd_quote

REPO = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("name", ["BAD-NAME", "X\n", "X\nLD_PRELOAD", "1X", ""])
def test_env_line_rejects_bad_names_with_a_full_match(name):
    assert systemd_env_line("SGLANG_ENABLE_SPEC_V2", 1) == 'Environment="SGLANG_ENABLE_SPEC_V2=1"'
    with pytest.raises(ValueError, match="inference_server_environment holds the name .* no environment variable name"):
        systemd_env_line(name, "x", "inference_server_environment")


def test_empty_argv_is_refused():
    with pytest.raises(ValueError):
        systemd_exec_lines([])


def filters() -> dict:
    """The Ansible entry point: filter_plugins/systemd_unit.py's FilterModule, loaded by its path."""
    spec = importlib.util.spec_from_file_location("systemd_unit_filters", REPO / "filter_plugins" / "systemd_unit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_the_filter_plugin_is_every_function_of_the_package_under_its_own_name():
    package = {name: value for name, value in vars(systemd_unit).items() if name.startswith("systemd_")}
    assert filters() == package and len(package) == 6


# (kind, values that are one, values that are not): no value passes with a trailing newline.
KIND_CASES = [
    ("account", ["inference", "_svc", "video", "a.b-c"], ["root\n", "in ference", "1abc", "-x", "a" * 33, ""]),
    (
        "unit",
        ["nvidia-persistenced.service", "srv-models.mount", "getty@tty1.service"],
        ["x.service\n", "x", "a b.service", "x.service;y"],
    ),
    ("unit_name", ["inference-server", "smg-gateway", "llm_2"], ["..", ".hidden", "-x", "a/b", "a b", "x\n"]),
    ("path", ["/var/lib/x", "/srv/models/Qwen3.6-27B", "/"], ["var/lib", "/a b", '/a"b', "/a\\b", "/x\n", ""]),
    (
        "address",
        ["10.0.4.17", "10.0.4.0/24", "::1", "2001:db8::/32", "localhost", "any"],
        ["10.0.0.300", "host", "10.0.4.0/24\n", ""],
    ),
    (
        "device",
        ["/dev/nvidiactl", "char-nvidia", "char-nvidia-caps", "block-loop"],
        ["/dev/x rw", "nvidia", "char-x\n"],
    ),
    ("limit_name", ["LimitNOFILE", "LimitCORE"], ["LimitFOO", "NOFILE", "LimitCORE\n"]),
    ("limit", ["0", "65536", "infinity", "1024:65536", "8M"], ["1 2", "-1", "", "0\n"]),
]


@pytest.mark.parametrize("kind, good, bad", KIND_CASES, ids=[c[0] for c in KIND_CASES])
def test_every_kind_takes_its_values_and_refuses_the_rest_naming_the_variable(kind, good, bad):
    text = filters()["systemd_text"]
    for value in good:
        assert text(value, "the_variable", kind) == value
    for value in bad:
        with pytest.raises(ValueError, match=r"^the_variable (holds )?'") as refused:
            text(value, "the_variable", kind)
        assert str(refused.value).endswith(("correct it", "remove it")), refused.value


def test_every_kind_is_tested():
    assert {case[0] for case in KIND_CASES} == set(systemd_unit.KINDS) - {"text", "setting"}


def test_a_comment_takes_any_printable_text_and_a_setting_or_path_doubles_its_percent():
    assert systemd_unit.systemd_text("50% of 'it' $HOME", "x") == "50% of 'it' $HOME"
    assert systemd_unit.systemd_text("50%n", "x", "setting") == "50%%n"
    assert systemd_unit.systemd_text("/srv/100%n", "x", "path") == "/srv/100%%n"
    with pytest.raises(ValueError, match="knows no kind 'nope'"):
        systemd_unit.systemd_text("x", "x", "nope")


def test_a_word_of_the_command_line_names_its_variable():
    with pytest.raises(ValueError, match="^gateway_extra_args 'a.nb' holds a control character"):
        systemd_exec_lines(["/bin/smg", "--x", "a\nb"], "gateway_extra_args")


def read_env_file(tmp_path: Path, text: str, names: list[str]) -> list[str]:
    """What a shell reads from an environment file: systemd's EnvironmentFile= parser takes the same quoting."""
    (tmp_path / "env").write_text(text)
    script = "set -a; . ./env; " + "; ".join(f'printf "%s\\0" "${name}"' for name in names)
    return subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split(
        "\0"
    )[:-1]


@pytest.mark.parametrize("value", ["plain-1.2/x=y", "", "a b", "it's", 'say "x"', "$HOME", "`id`", "back\\slash", "%h"])
def test_an_environment_file_line_gives_back_exactly_its_value(tmp_path, value):
    line = filters()["systemd_env_file_line"]("SECRET", value, "inference_server_secrets")
    assert read_env_file(tmp_path, line + "\n", ["SECRET"]) == [value]


@pytest.mark.parametrize("value", ["a\nLD_PRELOAD=/tmp/evil.so", "tab\there", "cr\r", "del\x7f"])
def test_an_environment_file_line_refuses_a_control_character_without_showing_the_value(value):
    with pytest.raises(ValueError) as refused:
        systemd_unit.systemd_env_file_line("SECRET", value, "inference_server_secrets")
    message = str(refused.value)
    assert message.startswith("the value of SECRET in inference_server_secrets holds a control character")
    assert value not in message and "evil" not in message


@pytest.mark.parametrize("name", ["BAD-NAME", "X\n", "X\nLD_PRELOAD", "1X"])
def test_an_environment_file_line_refuses_a_name_that_is_none(name):
    with pytest.raises(ValueError, match="^inference_server_secrets holds the name .* no environment variable name"):
        systemd_unit.systemd_env_file_line(name, "v", "inference_server_secrets")


def test_an_environment_file_is_its_lines_sorted_by_name(tmp_path):
    text = filters()["systemd_env_file"]({"B": "x y", "A": "1"}, "inference_server_secrets")
    assert text == 'A=1\nB="x y"\n' and filters()["systemd_env_file"]({}, "x") == ""
    assert read_env_file(tmp_path, text, ["A", "B"]) == ["1", "x y"]
