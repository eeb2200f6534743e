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


@pytest.fixture(scope="module")
def plan() -> dict:
    """The plan printed by tools/launch-plan for ct129 (offline, on the controller)."""
    # molecule's own Ansible settings (its inventory has no ct129) must not leak into the tool.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    out = subprocess.run([str(REPO / "tools/launch-plan"), "ct129", "--json"], capture_output=True, text=True,
                         check=True, cwd=REPO, env=env)
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
    for line in ("ExecStart=/root/ml-env.d/", " serve \\", "--speculative-algorithm NEXTN \\",
                 "--speculative-num-steps 3 \\", "--speculative-eagle-topk 1 \\",
                 "--speculative-num-draft-tokens 4 \\", "--mamba-scheduler-strategy extra_buffer",
                 "--tensor-parallel-size 2 \\", "--dtype bfloat16 \\", "--trust-remote-code \\",
                 "--host 0.0.0.0 \\", "--port 30000 \\", "--model-path /root/models/Qwen3.6-27B \\",
                 'Environment="SGLANG_ENABLE_SPEC_V2=1"', "User=root", "KillMode=control-group",
                 "TimeoutStartSec=1800"):
        assert line in unit, line


def test_unit_is_loaded_but_not_started(host):
    state = host.run(f"systemctl show -p LoadState,ActiveState,UnitFileState {UNIT}").stdout
    assert "LoadState=loaded" in state
    assert "ActiveState=inactive" in state
    assert "UnitFileState=disabled" in state
