"""Every value that enters a unit or an environment file of the project goes through the one filter for
unit text (filter_plugins/systemd_unit.py): a control character, or a value that is not what its directive
takes, is refused naming the variable, and nothing is written. The roles' real templates (the server's
unit, its secrets, the watchdog's and OnFailure='s units, the gateway's unit and key file), rendered by
ansible-playbook as a deploy renders them; issue 44, item 3."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from role_files import run_role_tasks
from test_drain import directives, render_unit, template_results, template_run

INJECTED = "ExecStartPre=+/usr/bin/touch /tmp/pwned"
# The issue's repro: a unit name in inference_server_after_units that brings its own [Service] lines.
REPRO = f"x.service\n[Service]\n{INJECTED}"
GATEWAY = {"_gateway_venv_dir": "/opt/smg-env.d/0123456789ab", "gateway_control_plane_api_key": "k" * 32}


def one_line(text: str) -> str:
    """``text`` on one line (Ansible wraps long messages)."""
    return " ".join(text.split())


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The run's output on one line."""
    return one_line(proc.stdout + proc.stderr)


CONTROL_CHARACTERS = [
    ("ml_env_engine_version", "5.6.0\nExecStartPre=+/usr/bin/touch /tmp/pwned"),
    ("model_sync_revision", "abc\rdef"),
    ("model_sync_name", "tiny\nUser=root"),
    ("model_sync_model_dir", "/srv/models/m\n[Service]"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[tuple[str, str], tuple[dict, Path]]:
    """(variable, repr of its value) -> the template task's result and where it was to write, for every hostile
    value of CONTROL_CHARACTERS and SERVER_UNIT_VALUES, each alone in the server's unit, in one run."""
    cases = [*CONTROL_CHARACTERS, *((variable, value) for variable, value, _ in SERVER_UNIT_VALUES)]
    results = template_results(tmp_path_factory.mktemp("refusals"), [{variable: value} for variable, value in cases])
    return {(variable, repr(value)): result for (variable, value), result in zip(cases, results, strict=True)}


def said(result: dict) -> str:
    """A refused task's message on one line."""
    return one_line(str(result.get("msg", "")))


@pytest.mark.parametrize("variable, value", CONTROL_CHARACTERS)
def test_a_control_character_in_a_comment_or_the_description_is_refused_naming_it(refusals, variable, value):
    result, dest = refusals[(variable, repr(value))]
    assert result.get("failed"), result
    assert f"{variable} {value[:80]!r} holds a control character, which would break the lines" in said(result)
    assert not dest.exists()


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


# (variable, hostile value, what the refusal says after the variable's name), rendered into the server's unit.
# Before issue 44 each of them went into the unit as it was: the newline ones as a line of their own.
SERVER_UNIT_VALUES = [
    ("inference_server_after_units", [REPRO], "holds a control character"),
    ("inference_server_after_units", ["a.service b.service"], "which is no systemd unit name"),
    ("inference_server_user", f"inference\n{INJECTED}", "holds a control character"),
    ("inference_server_group", "inference video", "which is no user or group name"),
    ("inference_server_state_dir", f"/var/lib/x\n{INJECTED}", "holds a control character"),
    ("inference_server_state_dir", "var/lib/x", "which is no absolute path"),
    ("inference_server_cache_dir", "/var/cache/x /etc", "which is no absolute path"),
    ("inference_server_mounts_for", [f"/srv\n{INJECTED}"], "holds a control character"),
    ("inference_server_ip_address_allow", [f"10.0.0.1\n{INJECTED}"], "holds a control character"),
    ("inference_server_ip_address_allow", ["10.0.0.300"], "which is no IP address or CIDR prefix"),
    ("inference_server_unit_name", f"llm\n{INJECTED}", "holds a control character"),
    ("inference_server_unit_name", "../llm", "which is no name for a unit"),
    ("inference_server_engine", f"transformers\n{INJECTED}", "holds a control character"),
    ("inference_server_limits", {"LimitNOFILE": f"1\n{INJECTED}"}, "holds a control character"),
    ("inference_server_limits", {"LimitNOFILE\nExecStartPre": 1}, "holds a control character"),
    ("inference_server_limits", {"LimitFOO": 1}, "which is no resource limit of systemd"),
]


@pytest.mark.parametrize(
    "variable, value, says", SERVER_UNIT_VALUES, ids=[f"{v}-{i}" for i, (v, *_) in enumerate(SERVER_UNIT_VALUES)]
)
def test_a_hostile_value_is_refused_naming_its_variable_before_the_unit_is_written(refusals, variable, value, says):
    result, dest = refusals[(variable, repr(value))]
    assert result.get("failed"), f"rendered:\n{dest.read_text() if dest.exists() else ''}"
    assert f"{variable} " in said(result) and says in said(result), said(result)[-1500:]
    assert not dest.exists()


def test_the_gpu_device_list_is_refused_with_a_line_of_its_own(tmp_path):
    proc = template_run(
        tmp_path, inference_server_engine="sglang", inference_server_gpu_devices=[f"/dev/nvidia0 rw\n{INJECTED}"]
    )
    assert proc.returncode != 0 and "inference_server_gpu_devices '/dev/nvidia0 rw" in refusal(proc)
    assert not (tmp_path / "unit").exists()


def test_the_repro_leaves_no_line_in_the_unit_and_good_values_render_as_before(tmp_path):
    """The same directives with values a host really has: the unit names exactly them."""
    unit = render_unit(
        tmp_path,
        inference_server_engine="sglang",
        inference_server_after_units=["nvidia-persistenced.service", "srv-models.mount"],
        inference_server_user="inference",
        inference_server_group="video",
        inference_server_state_dir="/var/lib/llm-100%",
    )
    assert directives(unit, "After") == ["network-online.target nvidia-persistenced.service srv-models.mount"]
    assert directives(unit, "Wants") == directives(unit, "After")
    assert (directives(unit, "User"), directives(unit, "Group")) == (["inference"], ["video"])


def test_a_percent_in_a_path_is_not_a_specifier(tmp_path):
    unit = render_unit(tmp_path, inference_server_state_dir="/var/lib/llm%n", inference_server_cache_dir="/c")
    assert directives(unit, "WorkingDirectory") == ["/var/lib/llm%%n"]
    assert directives(unit, "ReadWritePaths") == ["/var/lib/llm%%n /c"]


def render_secrets(tmp_path, secrets: dict) -> subprocess.CompletedProcess:
    """secrets.env.j2 rendered with ``inference_server_secrets``."""
    return template_run(tmp_path, template="secrets.env.j2", inference_server_secrets=secrets)


def test_a_newline_in_a_secret_is_refused_without_showing_it(tmp_path):
    """The issue's secrets.env: a newline in a value added LD_PRELOAD, which root's port guard got too."""
    secret = "s3cr3t-value\nLD_PRELOAD=/tmp/evil.so"
    proc = render_secrets(tmp_path, {"ENGINE_LICENSE_KEY": secret})
    out = refusal(proc)
    assert proc.returncode != 0
    assert "the value of ENGINE_LICENSE_KEY in inference_server_secrets holds a control character" in out, out[-1500:]
    assert "s3cr3t-value" not in out and "evil" not in out
    assert not (tmp_path / "unit").exists()


@pytest.mark.parametrize("name", ["BAD-NAME", "X\nLD_PRELOAD", "1X"])
def test_a_secret_whose_name_is_no_variable_name_is_refused(tmp_path, name):
    proc = render_secrets(tmp_path, {name: "v"})
    assert proc.returncode != 0 and "inference_server_secrets holds the name" in refusal(proc), refusal(proc)[-1500:]
    assert not (tmp_path / "unit").exists()


def test_every_secret_reaches_a_reader_of_the_file_exactly(tmp_path):
    """systemd's EnvironmentFile= parser and a shell agree on this quoting: read it back with sh."""
    secrets = {"PLAIN": "abc-123", "SPACED": "a b  c", "QUOTES": 'it\'s "quoted"', "SHELL": "$HOME `id` \\n %h"}
    render_secrets(tmp_path, secrets)
    text = (tmp_path / "unit").read_text()
    assert "PLAIN=abc-123\n" in text
    script = "set -a; . ./unit; " + "; ".join(f'printf "%s\\0" "${name}"' for name in sorted(secrets))
    read = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert dict(zip(sorted(secrets), read.split("\0")[:-1], strict=True)) == secrets


WATCHDOG_TEMPLATES = [
    "inference-server-watchdog.service.j2",
    "inference-server-gave-up.service.j2",
    "inference-server-watchdog.timer.j2",
]


@pytest.mark.parametrize("template", WATCHDOG_TEMPLATES)
def test_the_watchdogs_units_refuse_a_hostile_unit_name(tmp_path, template):
    proc = template_run(tmp_path, template=template, inference_server_unit_name=f"llm\n[Service]\n{INJECTED}")
    assert proc.returncode != 0 and "inference_server_unit_name 'llm" in refusal(proc), refusal(proc)[-1500:]
    assert not (tmp_path / "unit").exists()


@pytest.mark.parametrize(
    "variable, value",
    [
        ("gateway_extra_args", ["--log-level", f"warn\n{INJECTED}"]),
        ("gateway_user", f"smg\n{INJECTED}"),
        ("gateway_unit_name", f"smg\n{INJECTED}"),
        ("gateway_ip_address_allow", [f"10.0.0.1\n{INJECTED}"]),
        ("gateway_policy", f"cache_aware\n{INJECTED}"),
    ],
)
def test_the_gateways_unit_refuses_a_hostile_value_naming_it(tmp_path, variable, value):
    proc = template_run(tmp_path, template="smg-gateway.service.j2", role="gateway", **GATEWAY, **{variable: value})
    assert proc.returncode != 0 and f"{variable} " in refusal(proc), refusal(proc)[-1500:]
    assert not (tmp_path / "unit").exists()


def test_the_gateways_extra_arguments_reach_smg_as_written(tmp_path):
    """Shell quoting is not systemd's: '%h' and '$HOME' were expanded by systemd inside single quotes."""
    args = ["--log-dir", "/var/log/smg 100%h", "--x", "$HOME"]
    proc = template_run(tmp_path, template="smg-gateway.service.j2", role="gateway", gateway_extra_args=args, **GATEWAY)
    assert proc.returncode == 0, refusal(proc)[-1500:]
    unit = (tmp_path / "unit").read_text()
    exec_start = unit[unit.index("ExecStart=") : unit.index("\nRestart=")]
    assert exec_start.endswith('    --log-dir "/var/log/smg 100%%h" \\\n    --x "$$HOME"'), exec_start
    assert "'" not in exec_start


def test_the_gateways_key_file_refuses_a_newline_in_a_key_without_showing_it(tmp_path):
    key = "k" * 20 + "\nLD_PRELOAD=/tmp/evil.so"
    proc = template_run(
        tmp_path, template="control-plane.env.j2", role="gateway", **{**GATEWAY, "gateway_control_plane_api_key": key}
    )
    out = refusal(proc)
    assert proc.returncode != 0 and "SMG_CONTROL_PLANE_API_KEY in gateway_control_plane_api_key" in out, out[-1500:]
    assert "kkkkkkkk" not in out and "evil" not in out
    assert not (tmp_path / "unit").exists()


def test_the_gateways_key_file_keeps_a_safe_key_as_it_was(tmp_path):
    proc = template_run(tmp_path, template="control-plane.env.j2", role="gateway", gateway_api_key="a" * 24, **GATEWAY)
    assert proc.returncode == 0, refusal(proc)[-1500:]
    text = (tmp_path / "unit").read_text()
    assert f"SMG_CONTROL_PLANE_API_KEY={'k' * 32}\n" in text and f"SMG_API_KEY={'a' * 24}\n" in text


def precheck_run(tmp_path, **extra) -> subprocess.CompletedProcess:
    """inference_server's precheck.yml (the deploy's input checks, before anything changes on the host) on
    localhost; no model config, so the launch plan waits for the sync."""
    variables = {"inference_server_engine": "transformers", "model_sync_source_config": {}, **extra}
    return run_role_tasks(tmp_path, variables, ["precheck.yml"], check_mode=False)


def test_the_issues_repro_is_refused_by_the_precheck_naming_the_variable(tmp_path):
    """`-e '{"inference_server_after_units": ["x.service\\n[Service]\\nExecStartPre=+/usr/bin/touch /tmp/pwned"]}'`
    stops the deploy's input checks with the filter's sentence, before any role changes the host."""
    proc = precheck_run(tmp_path, inference_server_after_units=[REPRO])
    out = refusal(proc)
    assert proc.returncode != 0, out[-2000:]
    # The play stops with the filter's own sentence, without Ansible's wrapping.
    final = out.split("Refuse the value with the filter's own sentence")[-1].replace("''", "'")
    sentence = f"inference_server_after_units {REPRO!r} holds a control character, which would break the lines"
    assert sentence in final and "The filter plugin" not in final, out[-2000:]


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("inference_server_secrets", {"ENGINE_LICENSE_KEY": "s3cr3t\nLD_PRELOAD=/tmp/evil.so"}, "ENGINE_LICENSE_KEY"),
        ("inference_server_allowed_sources", ["10.0.4.0/24\n"], "inference_server_allowed_sources '10.0.4.0/24"),
        ("inference_server_user", "inference\nUser=root", "inference_server_user 'inference"),
        ("inference_server_limits", {"LimitCORE": "infinity\nX=1"}, "inference_server_limits 'infinity"),
    ],
)
def test_the_precheck_refuses_every_hostile_unit_value_naming_it(tmp_path, variable, value, says):
    proc = precheck_run(tmp_path, **{variable: value})
    out = refusal(proc)
    assert proc.returncode != 0 and says in out, out[-2000:]
    assert "s3cr3t" not in out and "evil" not in out


def test_the_precheck_passes_the_values_a_host_really_has(tmp_path):
    proc = precheck_run(
        tmp_path,
        inference_server_after_units=["nvidia-persistenced.service"],
        inference_server_secrets={"ENGINE_LICENSE_KEY": "a b $c"},
        inference_server_allowed_sources=["10.0.4.0/24", "2001:db8::/32"],
    )
    assert proc.returncode == 0, refusal(proc)[-2000:]


def test_the_replaced_limit_variable_is_refused_naming_its_successor(tmp_path):
    out = refusal(precheck_run(tmp_path, inference_server_limit_nofile=1048576))
    assert (
        "inference_server_limit_nofile (1048576) is no longer read: the unit's resource limits are one mapping now; "
        "set inference_server_limits to {LimitCORE: 0, LimitNOFILE: 1048576} instead." in out
    ), out[-2000:]


@pytest.mark.parametrize(
    "variable, name",
    [
        ("inference_server_environment", "LD_PRELOAD"),
        ("inference_server_environment", "LD_LIBRARY_PATH"),
        ("inference_server_secrets", "GCONV_PATH"),
        ("inference_server_environment", "GLIBC_TUNABLES"),
    ],
)
def test_a_variable_the_loader_reads_is_refused_because_the_port_guard_runs_as_root(tmp_path, variable, name):
    """Issue 51, item 6: the unit's environment reaches its root port guard (ExecStartPre=+), so LD_PRELOAD
    pointing into the service account's directory would have root load the account's library; the
    precheck refuses it by name, before anything changes, and never shows the value."""
    proc = precheck_run(tmp_path, **{variable: {name: "/var/lib/inference-server/evil.so", "OMP_NUM_THREADS": "4"}})
    out = refusal(proc)
    assert proc.returncode != 0, out[-2000:]
    assert f"{variable} sets {name}, which the dynamic loader or the C library reads" in out, out[-2000:]
    assert "evil" not in out


def test_engine_variables_that_merely_resemble_the_loaders_pass_the_precheck(tmp_path):
    proc = precheck_run(
        tmp_path,
        inference_server_environment={"SGLANG_LD_HINT": "1", "CUDA_MODULE_LOADING": "LAZY", "TMPDIR_HINT": "x"},
    )
    assert proc.returncode == 0, refusal(proc)[-2000:]
