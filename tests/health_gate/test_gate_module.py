"""The Ansible side: documentation, argument specs vs defaults, and the module run by Ansible.

The module runs under /usr/bin/python3 (the system python, as on a real host) to prove
it needs nothing beyond the standard library.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gate_fakes import CONTROLLER_BIN, REPO, ROLE, llm_gate

SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def tool(name: str) -> str:
    """An Ansible executable from the controller venv (or PATH)."""
    path = CONTROLLER_BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found next to {sys.executable} nor on PATH: run `make setup`")
    return found


def ansible_env() -> dict:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_DEPRECATION_WARNINGS="false",
        ANSIBLE_LIBRARY=str(ROLE / "library"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_NOCOLOR="1",
    )
    return env


def run_module(args: dict, check: bool = False) -> dict:
    """Run health_gate ad hoc on localhost; the module's result."""
    argv = [
        tool("ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        "health_gate",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={SYSTEM_PYTHON}",
    ]
    if check:
        argv.append("--check")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=ansible_env(), cwd=str(REPO))
    try:
        out = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        pytest.fail(f"ansible gave no JSON: rc {proc.returncode:d}\n{proc.stdout}\n{proc.stderr}")
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]


def load_module():
    """Import library/health_gate.py (its llm_gate is the collection's, installed)."""
    spec = importlib.util.spec_from_file_location("health_gate_module", ROLE / "library" / "health_gate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ansible_doc_renders_the_module():
    proc = subprocess.run(
        [tool("ansible-doc"), "-M", str(ROLE / "library"), "health_gate"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ansible_env(),
    )
    assert proc.returncode == 0, proc.stderr
    for word in (
        "min_decode_tps",
        "max_ttft_s",
        "min_accept_length",
        "ready_timeout_s",
        "report_dir",
        "report_path",
        "EXAMPLES",
        "RETURN VALUES",
    ):
        assert word in proc.stdout, word


def test_documented_options_match_the_argument_spec():
    module = load_module()
    doc = yaml.safe_load(module.DOCUMENTATION)
    spec = module.argument_spec()
    assert set(doc["options"]) == set(spec)
    for name, opt in spec.items():
        assert doc["options"][name]["type"] == opt["type"], name
        documented = doc["options"][name].get("default")
        if opt["type"] in ("int", "float") and opt.get("default") is not None:
            assert float(documented) == float(opt["default"]), name
        elif opt.get("default") not in (None, {}):
            assert documented == opt["default"], name
    yaml.safe_load(module.EXAMPLES)
    yaml.safe_load(module.RETURN)
    # every module option is a gate option (the CLI-only pid/log_file are the rest)
    assert set(spec) <= set(llm_gate.DEFAULTS)
    assert set(llm_gate.DEFAULTS) - set(spec) == {"pid", "log_file"}


def test_defaults_and_argument_specs_name_the_same_variables():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in ("main", "preflight"):
        assert set(specs[entry]["options"]) == set(defaults), entry
    for name, opt in specs["main"]["options"].items():
        assert name.startswith("health_gate_")
        assert opt.get("type") and opt.get("description") and "default" in opt, name
        if opt["type"] in ("int", "float", "bool") or isinstance(defaults[name], (list, dict)):
            assert opt["default"] == defaults[name], name


def test_the_role_passes_every_gate_variable_to_the_module():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    gate = (ROLE / "tasks" / "gate.yml").read_text()
    spec = load_module().argument_spec()
    for name in defaults:
        option = name[len("health_gate_") :]
        if option in ("unit_file", "env_file"):
            continue  # read by metadata.yml
        if option == "textfile_dir":
            assert name in gate  # the role writes the textfile itself, from the module's report
            continue
        if option == "async":
            assert name in gate  # the role runs the module detached or attached; the module is the same
            continue
        assert option in spec, name
        assert f"{option}:" in gate and name in gate, name


def short_gate(server, tmp_path, **changes) -> dict:
    """The module's arguments for a short gate against ``server``, reporting under tmp_path; ``changes`` on top."""
    return {
        "url": server.url,
        "warmup_requests": 0,
        "requests": 2,
        "max_tokens": 16,
        "poll_interval_s": 0.2,
        "min_decode_tps": 1,
        "report_dir": str(tmp_path / "gate"),
        **changes,
    }


def test_module_pass_is_unchanged_and_stores_the_report(fake_server, tmp_path):
    server = fake_server()
    out = run_module(
        short_gate(server, tmp_path, warmup_requests=1, metadata={"model_revision": "r1"}, api_key="sk-mod-555")
    )
    assert out.get("failed") is not True, out.get("msg")
    assert out["changed"] is False
    assert out["passed"] is True and out["msg"].startswith("gate PASS: ")
    assert Path(out["report_path"]).is_file()
    latest = json.loads((tmp_path / "gate" / "latest.json").read_text())
    assert latest["metadata"] == {"model_revision": "r1"} and latest["passed"] is True
    assert "sk-mod-555" not in json.dumps(out)
    assert server.chat_requests()[0]["headers"]["Authorization"] == "Bearer sk-mod-555"


def test_module_failure_fails_the_task_and_still_stores_the_report(fake_server, tmp_path):
    server = fake_server()
    out = run_module(short_gate(server, tmp_path, min_decode_tps=100000))
    assert out["failed"] is True and out["changed"] is False
    assert out["msg"].startswith("gate FAIL: ")
    assert "below min_decode_tps 100000" in out["msg"]
    latest = json.loads((tmp_path / "gate" / "latest.json").read_text())
    assert latest["passed"] is False and latest["reasons"]


def test_module_rejects_bad_thresholds_before_measuring(fake_server, tmp_path):
    server = fake_server()
    out = run_module({"url": server.url, "requests": 0, "min_decode_tps": -1, "report_dir": str(tmp_path / "gate")})
    assert out["failed"] is True
    assert out["msg"].startswith("health_gate: invalid options: ")
    assert "requests must be at least 1" in out["msg"]
    assert server.requests == []
    assert not (tmp_path / "gate").exists()


def test_module_in_check_mode_measures_but_writes_nothing(fake_server, tmp_path):
    server = fake_server()
    out = run_module(
        {
            "url": server.url,
            "warmup_requests": 0,
            "requests": 1,
            "max_tokens": 8,
            "poll_interval_s": 0.2,
            "report_dir": str(tmp_path / "gate"),
        },
        check=True,
    )
    assert out["passed"] is True and out["report_path"] is None
    assert not (tmp_path / "gate").exists()


def test_module_relative_gate_fails_a_slower_changed_unit(fake_server, tmp_path):
    """The baseline a passing report leaves, passed back through Ansible's argument spec."""
    server = fake_server()
    args = short_gate(server, tmp_path, metadata={"unit_sha256": "new"})
    first = run_module(args)
    assert first["passed"] is True, first.get("msg")
    baseline = dict(
        {
            "unit_sha256": "old",
            "requests": 2,
            "concurrency": 1,
            "max_tokens": 16,
            "prompts": first["report"]["settings"]["prompts"],
            "ttft_p95_s": None,
            "accept_length": None,
            "decode_tps_mean": first["report"]["aggregate"]["decode_tps_mean"] * 3,
        }
    )
    out = run_module(dict(args, baseline=baseline, max_regression_pct=10))
    assert out["failed"] is True
    assert "below the last-known-good's" in out["msg"] and "(max_regression_pct 10)" in out["msg"]
    relative = out["verdict"]["relative"]
    assert relative["compared"] is True and relative["passed"] is False and relative["baseline"] == baseline
    assert out["verdict"]["absolute"]["passed"] is True and out["baseline"] is None  # a failed gate records nothing
    same = run_module(dict(args, baseline=dict(baseline, unit_sha256="new"), max_regression_pct=10))
    assert same["passed"] is True
    assert "not compared with the last-known-good: the unit is the last-known-good one" in same["report"]["notes"]
    assert same["verdict"]["relative"]["compared"] is False


def test_module_returns_the_verdict_the_roles_read(fake_server, tmp_path):
    """verdict (with the reference comparison) and baseline, through Ansible's argument spec, in the report too."""
    server = fake_server()
    args = short_gate(server, tmp_path, metadata={"unit_sha256": "u1"})
    out = run_module(dict(args, reference={"decode_tps_mean": 1e9, "min_share": 0.5}))
    assert out["passed"] is True, out.get("msg")
    verdict = out["verdict"]
    figures = verdict["figures"]
    assert figures["unit_sha256"] == "u1"
    assert figures["decode_tps_mean"] == out["report"]["aggregate"]["decode_tps_mean"]
    # no kept baseline: the next deploy compares with this gate's figures
    assert out["baseline"] == verdict["baseline"] == figures
    # the reference is reported, never failing the gate: the caller reads ok
    assert verdict["reference"]["ok"] is False and verdict["reference"]["needed"] == 5e8
    stored = json.loads(Path(out["report_path"]).read_text())
    assert stored["verdict"] == verdict
    kept = dict(figures, decode_tps_mean=1.0, timestamp="earlier")
    again = run_module(dict(args, baseline=kept))
    assert again["baseline"] == kept  # the same unit and measurement keep their record
    bad = run_module(dict(args, reference={"decode_tps_mean": 1, "min_share": 1, "margin_pct": 1}))
    assert bad["failed"] is True and "reference needs exactly one of min_share and margin_pct" in bad["msg"]
