"""What nightly-deploy reads is what the real roles report: their set_stats, through ansible-runner.

The real health_gate role gates a fake server (tests/shared/gate_fakes.py) while watching a fake
systemd unit, and the real inference_server's restart.yml restarts that unit and sees its new start, in one
``ansible_runner.run`` as nightly-deploy makes it; the summary's gate figure, unit and restart come
from the run's custom stats (the ``playbook_on_stats`` event's ``artifact_data``), nothing else.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import ansible_runner
from gate_fakes import REPO, FakeSystemd
from test_nightly_support import load_tool

nd = load_tool()

PLAY = [
    {
        "name": "Restart and gate as deploy.yml does",
        "hosts": "localhost",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Restart the server, as a deploy and a rollback do",
                "ansible.builtin.include_role": {"name": "inference_server", "tasks_from": "restart.yml"},
                "vars": {"_inference_server_restart_task": "Restart the server"},
            },
            {"name": "Gate the deploy", "ansible.builtin.include_role": {"name": "health_gate"}},
        ],
    }
]


def run(tmp_path: Path, fake_server, **variables) -> dict:
    """The play above through ansible-runner; nightly's summary of its events, by host."""
    systemd = FakeSystemd(tmp_path / "systemd")
    systemd.set_state(InvocationID="inv-zero", ExecMainStartTimestamp="Mon 2026-11-30 01:00:01 UTC")
    systemd.set_next_state(InvocationID="inv-one", ExecMainStartTimestamp="Mon 2026-11-30 02:00:01 UTC")
    server = fake_server()
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "play.yml").write_text(json.dumps(PLAY))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "health_gate_url": server.url,
        "health_gate_warmup_requests": 0,
        "health_gate_requests": 2,
        "health_gate_max_tokens": 16,
        "health_gate_poll_interval_s": 0.2,
        "health_gate_min_decode_tps": 1,
        "health_gate_report_dir": str(tmp_path / "gate"),
        "health_gate_textfile_dir": "",
        # The fake server streams words and has no completions endpoint (the probe: tests/health_gate).
        "health_gate_correctness": "off",
        **variables,
    }
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        playbook="play.yml",
        inventory="localhost ansible_connection=local",
        extravars=extra,
        envvars={
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "FAKE_SYSTEMD": str(systemd.root),
            "PATH": f"{systemd.bin}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        quiet=True,
    )
    events = list(runner.events)
    stats = [e for e in events if e["event"] == "playbook_on_stats"][0]["event_data"]
    return {"rc": runner.rc, "hosts": nd.events.summarize_events(events), "stats": stats, "server": server}


def test_the_gate_and_the_restart_reach_nightly_through_set_stats(tmp_path, fake_server):
    out = run(tmp_path, fake_server)
    assert out["rc"] == 0, out["stats"]
    host = out["hosts"]["localhost"]
    report = json.loads((tmp_path / "gate" / "latest.json").read_text())
    gate = host.gate
    assert gate.passed is True and gate.decode_tps == report["aggregate"]["decode_tps_mean"] > 0
    assert gate.ttft_p95_s == report["aggregate"]["ttft_p95_s"] and gate.summary == report["summary"]
    assert gate.report_path.startswith(str(tmp_path / "gate")) and gate.timestamp == report["timestamp"]
    assert (gate.unit_invocation_id, gate.unit_started) == ("inv-one", "Mon 2026-11-30 02:00:01 UTC")
    assert host.restarts == 1 and host.restart_invocations == ["inv-one"]
    # the counts are the play recap's; the restart is the one change, the gate changes nothing
    assert host.ok > 5 and host.changed == 1 and host.healthy
    assert host.changed_tasks == ["inference_server : Restart the server"]
    assert set(out["stats"]["artifact_data"]) == {nd.events.STATS_KEY}


def test_a_failed_gate_still_reports_its_figure(tmp_path, fake_server):
    out = run(tmp_path, fake_server, health_gate_min_decode_tps=1e9)
    assert out["rc"] != 0
    host = out["hosts"]["localhost"]
    assert host.gate.passed is False and host.gate.decode_tps > 0
    assert "below min_decode_tps" in host.gate.summary
    assert not host.healthy and host.failed_tasks[-1]["task"] == "health_gate : Fail when the gate failed"
