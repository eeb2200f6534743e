"""tools/test-stages: the stages of ``make test`` timed, molecule's actions read from its output,
scenarios run in lanes, and the table's budget line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from deploytools import test_stages

TOOL = Path(__file__).resolve().parents[2] / "tools" / "test-stages"


@pytest.fixture
def stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run file of this test's own (the tool and its subprocesses write there)."""
    path = tmp_path / "stages.jsonl"
    monkeypatch.setenv("TEST_STAGES_FILE", str(path))
    return path


def _tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, check=False, env=env or dict(os.environ)
    )


def test_action_clock_reads_both_of_molecules_formats() -> None:
    clock = test_stages.ActionClock()
    # Without a terminal (CI, a pipe) and on one: both name the scenario and the action.
    assert clock.feed("INFO     [fleet > destroy] Executing", 10.0) == "destroy"
    assert clock.feed("INFO     [fleet > destroy] Executed: Successful", 11.0) is None
    assert clock.feed("\x1b[36mINFO\x1b[0m     fleet ➜ converge: \x1b[1mExecuting\x1b[0m", 12.5) == "converge"
    assert clock.feed("TASK [Executing the plan] ****", 13.0) is None
    # verify announces itself twice in a row (the command, then the testinfra verifier): one action.
    assert clock.feed("INFO     [fleet > verify] Executing", 30.0) == "verify"
    assert clock.feed("INFO     [fleet > verify] Executing", 30.1) is None
    assert clock.feed("INFO     [fleet > destroy] Executing", 40.0) == "destroy"
    clock.close(41.0)
    assert clock.summary() == [
        {"action": "destroy", "seconds": 2.5},
        {"action": "converge", "seconds": 17.5},
        {"action": "verify", "seconds": 10.0},
        {"action": "destroy", "seconds": 1.0},
    ]


def test_run_records_the_stage_and_keeps_the_exit_status(stages: Path) -> None:
    assert _tool("start").returncode == 0
    ok = _tool("run", "first", "--", sys.executable, "-c", "print('hello')")
    assert ok.returncode == 0 and "hello" in ok.stdout
    bad = _tool("run", "second", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert bad.returncode == 3
    assert "FAILED (exit 3)" in bad.stdout
    recorded = test_stages.read_stages(stages)
    assert [(s["name"], s["rc"]) for s in recorded] == [("first", 0), ("second", 3)]
    assert all(s["end"] >= s["start"] and s["seconds"] >= 0 for s in recorded)
    # start forgets the last run.
    assert _tool("start").returncode == 0
    assert test_stages.read_stages(stages) == []


def test_molecule_lanes_run_scenarios_at_once_and_time_their_actions(stages: Path, tmp_path: Path) -> None:
    """A stand-in ``molecule`` on PATH prints molecule's action lines and sleeps: two lanes
    overlap the scenarios, each scenario's actions are timed, a failure is reported with its
    status and the tail of its log."""
    fake = tmp_path / "bin" / "molecule"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        "s=$3\n"
        'echo "INFO     [$s > create] Executing"; sleep 0.6\n'
        'echo "INFO     [$s > converge] Executing"; sleep 0.6\n'
        'echo "INFO     [$s > destroy] Executing"\n'
        '[ "$s" = broken ] && { echo "fatal: the last words of $s"; exit 4; }\n'
        "exit 0\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    done = _tool("molecule", "--lanes", "2", "alpha", "broken", env=env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "molecule broken: FAILED (exit 4)" in done.stdout
    assert "fatal: the last words of broken" in done.stdout
    by_name = {s["name"]: s for s in test_stages.read_stages(stages)}
    assert set(by_name) == {"molecule alpha", "molecule broken"}
    alpha, broken = by_name["molecule alpha"], by_name["molecule broken"]
    assert alpha["rc"] == 0 and broken["rc"] == 4
    assert [a["action"] for a in alpha["actions"]] == ["create", "converge", "destroy"]
    assert all(a["seconds"] >= 0.5 for a in alpha["actions"][:2])
    # Two lanes: the second scenario started before the first ended, each in a lane of its own.
    assert max(alpha["start"], broken["start"]) < min(alpha["end"], broken["end"])
    assert {alpha["lane"], broken["lane"]} == {"lane 1", "lane 2"}
    assert (stages.parent / "molecule-broken.log").read_text().endswith("fatal: the last words of broken\n")


def test_molecule_that_cannot_be_started_fails_the_run(stages: Path, tmp_path: Path) -> None:
    """No molecule on PATH: every scenario fails with 127, never a silent pass."""
    env = dict(os.environ, PATH=str(tmp_path))
    done = subprocess.run(
        [sys.executable, str(TOOL), "molecule", "--lanes", "2", "alpha", "beta"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 127, done.stdout + done.stderr
    assert "molecule alpha: FAILED (exit 127)" in done.stdout
    assert "cannot run molecule" in done.stdout
    assert {s["name"]: s["rc"] for s in test_stages.read_stages(stages)} == {
        "molecule alpha": 127,
        "molecule beta": 127,
    }


def test_schedule_starts_the_longest_known_job_first() -> None:
    known = {"molecule fast": 60.0, "molecule slow": 900.0, "lint": 30.0, "pytest": 400.0}
    jobs = ["molecule fast", "molecule new", "pytest", "molecule slow"]
    assert test_stages.schedule(jobs, known) == ["molecule new", "molecule slow", "pytest", "molecule fast"]
    assert test_stages.schedule(["b", "a"], {}) == ["b", "a"]


def test_a_job_beside_the_lanes_runs_niced_and_takes_no_lane(stages: Path, tmp_path: Path) -> None:
    """``--beside NAME=COMMAND`` runs from the start beside the scenarios at nice 19 without taking
    their lane (one lane: the two scenarios one after the other, the job beside both), is recorded
    as a stage (no actions), its log kept and its last lines printed; its failure fails the run."""
    fake = tmp_path / "bin" / "molecule"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "INFO     [$3 > converge] Executing"; sleep 0.8\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH=f"{fake.parent}:{os.environ['PATH']}")
    # The job says its nice value and its CPU cgroup (cgroup v1's cpu controller line, or v2's).
    script = tmp_path / "unit.py"
    script.write_text(
        "import os, re, time\ntime.sleep(1.2)\nprint('nice', os.nice(0))\n"
        "lines = open('/proc/self/cgroup').read()\n"
        "print('cgroup', *re.findall(r'(?m)^\\d+:(?:cpu|cpu,cpuacct|):(/.*)$', lines))\n"
        "print('7 passed')\nraise SystemExit(5)\n"
    )
    job = f"unit={sys.executable} {script}"
    done = _tool("molecule", "--lanes", "1", "--beside", job, "alpha", "beta", env=env)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "unit: FAILED (exit 5)" in done.stdout and "7 passed" in done.stdout
    by_name = {s["name"]: s for s in test_stages.read_stages(stages)}
    assert set(by_name) == {"molecule alpha", "molecule beta", "unit"}
    unit, alpha, beta = by_name["unit"], by_name["molecule alpha"], by_name["molecule beta"]
    assert unit["kind"] == "stage" and "actions" not in unit and unit["rc"] == 5
    # The job overlapped the first scenario, and the one lane ran the scenarios one after the other.
    first, second = sorted((alpha, beta), key=lambda s: s["start"])
    assert max(first["start"], unit["start"]) < min(first["end"], unit["end"])
    assert second["start"] >= first["end"]
    niced = min(19, os.nice(0) + test_stages.NICE_BESIDE)  # nice stops at 19
    nice_line, cgroup_line, passed_line = (stages.parent / "unit.log").read_text().splitlines()
    assert (nice_line, passed_line) == (f"nice {niced}", "7 passed")
    # In the beside cgroup where this machine lets test-stages make one (it says which on the console).
    procs = test_stages.beside_cgroup()
    if procs is None:
        assert "in no cgroup of their own" in done.stdout
    else:
        assert cgroup_line.split()[1] == f"/{test_stages.BESIDE_CGROUP}", cgroup_line  # the cpu controller's
        assert f"in the cgroup {procs.parent}" in done.stdout
    # A job that is not NAME=COMMAND is refused in one sentence, before anything runs.
    bad = _tool("molecule", "--beside", "pytest", "alpha", env=env)
    assert bad.returncode == 2 and "write it as NAME=COMMAND" in bad.stderr
    unclosed = _tool("molecule", "--beside", "unit=echo 'open", "alpha", env=env)
    assert unclosed.returncode == 2 and "argument --beside: " in unclosed.stderr
    assert "No closing quotation" in unclosed.stderr


def _stage(name: str, seconds: float, start: float, rc: int = 0, **extra: object) -> dict[str, object]:
    return {"name": name, "seconds": seconds, "start": start, "end": start + seconds, "rc": rc, **extra}


def test_report_names_the_three_slowest_and_warns_over_budget(stages: Path, tmp_path: Path) -> None:
    rows = [
        _stage("setup", 300, 0),
        _stage("lint", 60, 300),
        _stage("pytest", 400, 360),
        _stage("molecule fleet", 1500, 760, actions=[{"action": "converge", "seconds": 200.0}]),
        _stage("molecule default", 900, 760, rc=2),
    ]
    stages.write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = tmp_path / "times.json"
    out = _tool("report", "--record", str(record))
    assert out.returncode == 0, out.stderr
    last = [line for line in out.stdout.splitlines() if line.startswith(("budget", "WARNING"))]
    # Wall time 760 + 1500 = 2260 s: within 2400.
    assert last == [
        "budget: 2260 s of 2400 s (94 %); slowest: molecule fleet 1500 s, molecule default 900 s, pytest 400 s"
    ]
    assert "  converge" in out.stdout and "FAILED (2)" in out.stdout
    runs = json.loads(record.read_text())["runs"]
    assert runs[-1]["total_s"] == 2260 and runs[-1]["passed"] is False
    assert [s["name"] for s in runs[-1]["stages"]] == [r["name"] for r in rows]

    over = _tool("report", "--budget-s", "2000")
    assert "WARNING budget: 2260 s is over the 2000 s budget (113 %)" in over.stdout
    assert over.returncode == 0
    # A second record appends: the file keeps every run.
    _tool("report", "--record", str(record))
    assert len(json.loads(record.read_text())["runs"]) == 2


def test_report_without_stages_says_so(stages: Path) -> None:
    out = _tool("report")
    assert out.returncode == 2
    assert "no stages recorded" in out.stderr


def test_the_beside_cgroup_is_made_at_the_lowest_weight_or_not_at_all(tmp_path: Path) -> None:
    """The first hierarchy where the group can be made and weighted wins; none gives None (nice only)."""
    missing = tmp_path / "no-such-hierarchy"
    procs = test_stages.beside_cgroup(((missing, "cpu.shares", "2"), (tmp_path, "cpu.weight", "1")))
    assert procs == tmp_path / test_stages.BESIDE_CGROUP / "cgroup.procs"
    assert (tmp_path / test_stages.BESIDE_CGROUP / "cpu.weight").read_text() == "1"
    assert not missing.exists()
    assert test_stages.beside_cgroup(((missing, "cpu.shares", "2"),)) is None


def test_a_run_notes_the_machine_at_its_start_and_end_and_each_stages_lane(stages: Path, tmp_path: Path) -> None:
    """Runs on machines 1.5x apart are compared through the load average and a yardstick (a fixed
    workload timed at the start and at the end of the same run), kept with the run."""
    assert _tool("start").returncode == 0
    assert test_stages.read_stages(stages) == []
    started = test_stages.read_machine(stages)
    assert list(started) == ["start"]
    assert len(started["start"]["load_avg"]) == 3 and started["start"]["yardstick_s"] > 0
    with stages.open("a") as handle:
        handle.write(json.dumps(_stage("pytest", 40, started["start"]["at"] + 1, lane="beside")) + "\n")
        handle.write(json.dumps(_stage("molecule fleet", 30, started["start"]["at"] + 2, lane="lane 1")) + "\n")
    record = tmp_path / "times.json"
    out = _tool("report", "--record", str(record))
    assert out.returncode == 0, out.stderr
    run = json.loads(record.read_text())["runs"][-1]
    assert set(run["yardstick_s"]) == set(run["load_avg"]) == {"start", "end"}
    assert all(value > 0 for value in run["yardstick_s"].values())
    assert [(s["name"], s["lane"], s["start_s"]) for s in run["stages"]] == [
        ("pytest", "beside", 0.0),
        ("molecule fleet", "lane 1", 1.0),
    ]
    assert "machine at the start: load " in out.stdout and "machine at the end: load " in out.stdout
    assert "lane 1" in out.stdout
    # A later report (recording the run once more) keeps the note taken when the run ended.
    assert _tool("report", "--record", str(record)).returncode == 0
    again = json.loads(record.read_text())["runs"][-1]
    assert again["yardstick_s"] == run["yardstick_s"] and again["load_avg"] == run["load_avg"]


def test_how_busy_the_machine_was_is_read_from_its_cpu_counters(tmp_path: Path) -> None:
    """Busy is all of /proc/stat's first line but idle and iowait; two readings give the share between."""
    hertz = os.sysconf("SC_CLK_TCK")
    stat_file = tmp_path / "stat"
    stat_file.write_text(f"cpu  {3 * hertz} 0 {hertz} {5 * hertz} {hertz} 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert test_stages.cpu_seconds(str(stat_file)) == [4.0, 10.0]
    assert test_stages.cpu_seconds(str(tmp_path / "absent")) == [0.0, 0.0]
    assert test_stages.busy_between([4.0, 10.0], [7.0, 14.0]) == 0.75
    assert test_stages.busy_between([0.0, 0.0], [0.0, 0.0]) is None
    busy, total = test_stages.cpu_seconds()
    assert 0 < busy < total  # this machine's own counters


def test_the_containers_cpu_is_summed_over_those_that_came_and_went(tmp_path: Path) -> None:
    """cgroup v1 (cpuacct.usage, ns) and v2 (cpu.stat usage_usec); a container removed between samples keeps
    its last sample; one that ran before the meter started counts only what it used after."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    (v1 / "old").mkdir(parents=True)
    (v1 / "old" / "cpuacct.usage").write_text(str(5 * 10**9))
    patterns = (str(v1 / "*" / "cpuacct.usage"), str(v2 / "*" / "cpu.stat"))
    meter = test_stages.ContainerMeter(interval=3600, patterns=patterns).start()
    (v1 / "old" / "cpuacct.usage").write_text(str(7 * 10**9))
    (v2 / "gone").mkdir(parents=True)
    (v2 / "gone" / "cpu.stat").write_text("usage_usec 4000000\nuser_usec 3000000\n")
    meter._sample()
    (v2 / "gone" / "cpu.stat").unlink()
    (v2 / "gone").rmdir()
    assert test_stages.container_cpu_seconds(patterns) == {str(v1 / "old"): 7.0}
    assert meter.stop() == {"containers": 2, "cpu_s": 6.0}


def test_the_report_says_how_busy_the_run_was_and_where(stages: Path) -> None:
    machine = {
        "start": {"load_avg": [1, 1, 1], "yardstick_s": 0.5, "cpu": [100.0, 200.0]},
        "end": {"load_avg": [2, 2, 2], "yardstick_s": 0.6, "cpu": [1900.0, 2200.0]},
    }
    stage = {**_stage("molecule fleet", 1000, 10.0, lane="lane 1"), "busy": 0.93}
    run = test_stages.build_run([stage], "test", machine, {"busy_cpu_s": 1800.0, "cpu_s": 1200.0, "containers": 3})
    assert (run["cpu_busy_s"], run["busy"], run["stages"][0]["busy"]) == (1800.0, 0.9, 0.93)
    text = test_stages.render(run, 2400)
    assert "93 %" in text
    assert f"CPU: 1800 core-seconds busy, 90 % of {run['cpus']} cores x wall" in text
    assert "lanes: 1800 core-seconds busy, 1200 of them (67 %) inside the 3 containers" in text


def test_each_stage_keeps_the_cpu_of_its_own_process_tree(stages: Path) -> None:
    """wait4's usage of the stage's command: its descendants' CPU too, and next to none for one that sleeps."""
    burn = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(10**7))'])"
    assert _tool("run", "burn", "--", sys.executable, "-c", burn).returncode == 0
    assert _tool("run", "idle", "--", sys.executable, "-c", "import time; time.sleep(1)").returncode == 0
    by_name = {s["name"]: s for s in test_stages.read_stages(stages)}
    assert by_name["burn"]["tree_cpu_s"] >= 0.3, by_name["burn"]  # the grandchild's loop, counted
    assert by_name["idle"]["tree_cpu_s"] < 0.3 and by_name["idle"]["seconds"] >= 1.0, by_name["idle"]
    run = test_stages.build_run(list(by_name.values()), "test")
    assert [s["tree_cpu_s"] for s in run["stages"]] == [by_name["burn"]["tree_cpu_s"], by_name["idle"]["tree_cpu_s"]]
    assert "tree" in test_stages.render(run, 2400).splitlines()[2]
