"""systemd's own reading of the rendered ct129 unit equals `tools/launch-plan ct129`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UNIT = "inference-server"
KEY = "render-ct129-not-a-secret"  # converge.yml's inference_server_api_key


@pytest.fixture(scope="module")
def plan() -> dict:
    """The plan printed by tools/launch-plan for ct129 (offline, on the controller)."""
    # molecule's own Ansible settings (its inventory has no ct129) must not leak into the tool.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    out = subprocess.run(
        [str(REPO / "tools/launch-plan"), "ct129", "--json", "-e", json.dumps({"inference_server_api_key": KEY})],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    )
    assert KEY not in out.stdout
    return json.loads(out.stdout)["plan"]


def systemd_exec_argv(host) -> list[str]:
    """ExecStart as systemd parsed it: the argv[] field of `systemctl show -p ExecStart`."""
    shown = host.run(f"systemctl show -p ExecStart --value {UNIT}").stdout
    match = re.search(r"argv\[\]=(.*?) ;", shown)
    assert match, shown
    return match.group(1).split(" ")


def test_systemd_parses_exactly_the_plan_argv(host, plan):
    assert systemd_exec_argv(host) == plan["argv"]


def test_systemd_parses_exactly_the_plan_environment(host, plan):
    shown = host.run(f"systemctl show -p Environment --value {UNIT}").stdout.split()
    assert dict(item.split("=", 1) for item in shown) == plan["env"]


def test_unit_carries_the_origin_story_working_flags(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}.service").content_string
    for line in (
        "ExecStart=/root/ml-env.d/",
        " serve \\",
        "--speculative-algorithm NEXTN \\",
        "--speculative-num-steps 3 \\",
        "--speculative-eagle-topk 1 \\",
        "--speculative-num-draft-tokens 4 \\",
        "--mamba-scheduler-strategy extra_buffer",
        "--tensor-parallel-size 2 \\",
        "--dtype bfloat16 \\",
        "--trust-remote-code \\",
        "--host 0.0.0.0 \\",
        "--port 30000 \\",
        "--model-path /root/models/Qwen3.6-27B \\",
        'Environment="SGLANG_ENABLE_SPEC_V2=1"',
        "User=root",
        "KillMode=mixed",
        "TimeoutStartSec=1800",
        "TimeoutStopSec=150",
    ):
        assert line in unit, line


def test_unit_is_loaded_but_not_started(host):
    state = host.run(f"systemctl show -p LoadState,ActiveState,UnitFileState {UNIT}").stdout
    assert "LoadState=loaded" in state
    assert "ActiveState=inactive" in state
    assert "UnitFileState=disabled" in state


def test_the_key_reaches_sglang_through_files_only(host, plan):
    key_file = host.file(f"/etc/{UNIT}/api-key.yaml")
    assert key_file.mode == 0o640 and key_file.user == "root"
    lines = [ln for ln in key_file.content_string.splitlines() if ln and not ln.startswith("#")]
    assert lines == [f'api-key: "{KEY}"']
    assert plan["argv"][-2:] == ["--config", f"/etc/{UNIT}/api-key.yaml"]
    assert KEY not in host.file(f"/etc/systemd/system/{UNIT}.service").content_string


def test_sglang_logs_through_the_plans_configuration_without_its_argument_dump(host, plan):
    config = host.file(f"/etc/{UNIT}/sglang-logging.json")
    assert config.mode == 0o644 and config.user == "root"
    assert json.loads(config.content_string) == plan["logging_config"]
    assert plan["logging_config"]["loggers"]["sglang.srt.entrypoints.engine"]["level"] == "WARNING"
    assert plan["env"]["SGLANG_LOGGING_CONFIG_PATH"] == config.path
    assert KEY not in config.content_string
