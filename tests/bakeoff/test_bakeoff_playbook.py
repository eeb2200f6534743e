"""playbooks/bakeoff.yml against stand-ins for deploy.yml, rollback.yml and gate.yml (localhost).

The stand-ins write gate reports with a candidate's ``fake_tps`` where the real playbooks would
deploy and measure; the bake-off's own logic runs for real: rows, ranking, the margin, the
table on both sides, keeping the winner or going back, and a failed candidate's message.
molecule/rollback runs it for real against the rehearsal engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

STUB = [
    {
        "name": "Stand-in",
        "hosts": "all",
        "gather_facts": False,
        "vars": {"fake_tps": 50},
        "tasks": [
            # raw, not copy and shell: the stand-in runs up to nine times per test, and a raw task is
            # one /bin/sh on the controller where copy and shell each start a module's Python (copy
            # twice per file). It writes the same files with the same content.
            {
                "name": "Write a report as the gate would",
                "ansible.builtin.raw": (
                    "printf '%s' {{ _stub_report | quote }} | tee {{ _stub_path | quote }}"
                    " > {{ (stub_state_dir ~ '/gate/latest.json') | quote }}"
                ),
                "changed_when": True,
                "vars": {
                    "_stub_path": "{{ stub_state_dir }}/gate/2{{ now(utc=true).strftime('%Y%m%dT%H%M%S%f') }}.json",
                    "_stub_report": "{{ {'passed': fake_tps | float > 0, 'summary': 'gate', 'timestamp': 't', "
                    "'metadata': {'unit_sha256': 'u'}, 'aggregate': {'decode_tps_mean': fake_tps | float, "
                    "'ttft_p95_s': 0.1, 'total_tps': fake_tps | float * (health_gate_concurrency | default(1) | int), "
                    "'requests': 4}, 'settings': {'concurrency': health_gate_concurrency | default(1) | int}, "
                    "'speculative': none, 'verdict': {'reference': _stub_reference}} | to_json }}",
                    # The real gate compares with health_gate_reference in llm_gate.verdict (tests/health_gate);
                    # here only its ok, for the bake-off to read.
                    "_stub_reference": "{{ {'ok': fake_tps | float > health_gate_reference.decode_tps_mean | float "
                    "* (1 + health_gate_reference.margin_pct | float / 100)} if health_gate_reference is defined "
                    "and health_gate_reference.decode_tps_mean is number else none }}",
                },
            },
            {
                "name": "Record the reference the gate was given",
                "ansible.builtin.raw": (
                    "echo '{{ health_gate_reference | to_json }}' >> {{ stub_state_dir }}/references.log"
                ),
                "changed_when": True,
                "when": "health_gate_reference is defined",
            },
            {
                "name": "Record who ran",
                "ansible.builtin.raw": "echo '{{ ansible_play_name }} {{ fake_tps }}' >> {{ stub_state_dir }}/runs.log",
                "changed_when": True,
            },
            {
                "name": "Fail as a refused deploy does",
                "ansible.builtin.fail": {"msg": "Deploy step 'x' failed: refused."},
                "when": "fake_tps | float <= 0",
            },
        ],
    }
]


def run_bakeoff(tmp_path: Path, candidates: list[dict], margin: float = 10) -> tuple[subprocess.CompletedProcess, Path]:
    repo, state = tmp_path / "repo", tmp_path / "state"
    (repo / "playbooks").mkdir(parents=True)
    shutil.copy(ROOT / "playbooks" / "bakeoff.yml", repo / "playbooks")
    shutil.copytree(ROOT / "playbooks" / "tasks", repo / "playbooks" / "tasks")
    for name, play in (
        ("deploy.yml", "deploy"),
        ("playbooks/rollback.yml", "rollback"),
        ("playbooks/gate.yml", "gate"),
    ):
        (repo / name).write_text(yaml.safe_dump([dict(STUB[0], name=play)]))
    (state / "gate").mkdir(parents=True)
    (state / "last-known-good").mkdir()
    (state / "last-known-good" / "state.json").write_text("{}")
    (tmp_path / "inv.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "h1": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "stub_state_dir": str(state),
                        }
                    }
                }
            }
        )
    )
    (tmp_path / "vars.json").write_text(
        json.dumps(
            {
                "bakeoff_candidates": candidates,
                "bakeoff_concurrency": 2,
                "bakeoff_margin_pct": margin,
                "bakeoff_controller_dir": str(tmp_path / "out"),
                "bakeoff_state_dir": str(state),
            }
        )
    )
    env = dict(
        os.environ,
        ANSIBLE_FILTER_PLUGINS=str(ROOT / "filter_plugins"),
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(tmp_path / "inv.yml"),
            str(repo / "playbooks" / "bakeoff.yml"),
            "-e",
            f"@{tmp_path / 'vars.json'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    return proc, state


def test_the_winner_is_kept_when_it_beats_the_margin(tmp_path):
    proc, state = run_bakeoff(
        tmp_path,
        [
            {"name": "fast", "vars": {"fake_tps": 80}},
            {"name": "slow", "vars": {"fake_tps": 30}},
            {"name": "broken", "vars": {"fake_tps": 0}},
        ],
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    table = json.loads((tmp_path / "out" / "h1" / "bakeoff.json").read_text())
    assert [(r["name"], r["passed"]) for r in table["rows"]] == [
        ("last-known-good", True),
        ("fast", True),
        ("slow", True),
        ("broken", False),
    ]
    assert table["rows"][1]["single"]["decode_tps_mean"] == 80 and table["rows"][1]["concurrent"]["concurrency"] == 2
    assert table["rows"][3]["failure"] == "Deploy step 'x' failed: refused."
    assert table["winner"] == "fast" and table["kept"] is True
    assert json.loads((state / "bakeoff" / "bakeoff.json").read_text()) == table
    # Incumbent, three trials each with a gate at concurrency 2 (not the broken one), then the winner for real.
    runs = (state / "runs.log").read_text().split("\n")
    assert runs[:2] == ["rollback 50", "gate 50"] and runs[-2:] == ["deploy 80", ""]
    # Each candidate's trial gate was given the incumbent's single-stream figure and the margin.
    references = [json.loads(line) for line in (state / "references.log").read_text().splitlines()]
    assert references == [{"decode_tps_mean": 50.0, "margin_pct": 10.0}] * 3
    assert "rollback" not in runs[2:]


def test_no_winner_by_the_margin_goes_back_to_the_last_known_good(tmp_path):
    proc, state = run_bakeoff(tmp_path, [{"name": "almost", "vars": {"fake_tps": 54}}])
    assert proc.returncode == 0, proc.stdout[-3000:]
    table = json.loads((tmp_path / "out" / "h1" / "bakeoff.json").read_text())
    assert table["kept"] is False
    assert (state / "runs.log").read_text().split("\n")[-2] == "rollback 50"
    assert "no candidate beat the last-known-good (50.0 tok/s) by more than 10" in proc.stdout


def test_bad_candidates_are_refused_before_anything_runs(tmp_path):
    proc, state = run_bakeoff(tmp_path, [{"name": "bad name", "vars": {}}])
    assert proc.returncode != 0
    assert "bakeoff_candidates must be a non-empty list of {name, vars}" in proc.stdout
    assert not (state / "runs.log").exists()
