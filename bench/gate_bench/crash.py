"""Experiment (a): crash detection, the gate against ``sleep 15 && tail -50`` on the same start."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import ENTRY, REPO, log
from .servers import UnitBackend

IMAGE = "local/bookworm-systemd"
SCENARIOS = ("kill_during_load", "broken_weights", "slow_load_crash")
TB_START = "Traceback (most recent call last):"
EXCEPTION_RE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b")


def traceback_stats(text: str, full: str) -> dict[str, Any]:
    """Does ``text`` hold the whole last traceback of ``full``?

    The traceback runs from its ``Traceback (most recent call last):`` line to the line
    that names the raised exception (``SafetensorError: ...``); systemd's own lines after
    it ("Main process exited") are not part of it.
    """
    full_lines = full.splitlines()
    start = max((i for i, line in enumerate(full_lines) if line.startswith(TB_START)), default=None)
    if start is None:
        return {
            "traceback_in_log": False,
            "shows_traceback_start": None,
            "shows_exception": None,
            "traceback_complete": None,
        }
    raised = [i for i in range(start + 1, len(full_lines)) if EXCEPTION_RE.match(full_lines[i])]
    end = raised[-1] if raised else len(full_lines) - 1
    tb = [line for line in full_lines[start : end + 1] if line.strip()]
    shown = set(text.splitlines())
    return {
        "traceback_in_log": True,
        "traceback_lines": len(tb),
        "exception": tb[-1],
        "shows_traceback_start": TB_START in shown,
        "shows_exception": tb[-1] in shown,
        "traceback_complete": all(line in shown for line in tb),
    }


def crash_run(backend: Any, scenario: str, port: int) -> dict[str, Any]:
    """Start, crash, and time the gate against sleep-and-tail on the same start."""
    t0 = backend.start(scenario, port)
    gate = subprocess.Popen(backend.gate_argv(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tail = subprocess.Popen(backend.tail_argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at = None
    t_gate = t_tail = None
    try:
        while t_gate is None or t_tail is None:
            now = time.monotonic()
            backend.poll_exit()
            if scenario == "kill_during_load" and killed_at is None and now - t0 >= 2.0:
                backend.kill()
                killed_at = time.monotonic()
            if t_gate is None and gate.poll() is not None:
                t_gate = time.monotonic()
            if t_tail is None and tail.poll() is not None:
                t_tail = time.monotonic()
            if now - t0 > 240:
                raise RuntimeError(f"run {scenario} took more than 240 s")
            time.sleep(0.01)
        for _ in range(200):  # the broken server may exit a moment after the gate noticed
            backend.poll_exit()
            if backend.crash_time() is not None:
                break
            time.sleep(0.01)
        t_crash = backend.crash_time()
        full = backend.full_log()
    finally:
        for proc in (gate, tail):
            if proc.poll() is None:
                proc.kill()
        backend.cleanup()
    gate_out, gate_err = gate.communicate()
    tail_out = tail.communicate()[0]
    try:
        report = json.loads(gate_out)
    except ValueError:
        report = {"reasons": [f"gate printed no JSON: {(gate_out + gate_err)[-500:]}"], "evidence": None}
    evidence = (report.get("evidence") or {}).get("log") or ""
    crash_s = None if t_crash is None else t_crash - t0
    tail_missed = t_crash is None or t_crash > t_tail
    run = {
        "mode": backend.mode,
        "scenario": scenario,
        "crash_since_start_s": round(crash_s, 3) if crash_s is not None else None,
        "gate_exit_code": gate.returncode,
        "gate_detect_s": round(t_gate - t_crash, 3) if t_crash is not None else None,
        "gate_since_start_s": round(t_gate - t0, 3),
        "gate_phase": report.get("phase"),
        "gate_reason": (report.get("reasons") or [""])[0][:300],
        "gate_evidence_lines": (report.get("evidence") or {}).get("log_lines"),
        "sleep_tail_since_start_s": round(t_tail - t0, 3),
        "sleep_tail_detect_s": None if tail_missed else round(t_tail - t_crash, 3),
        "sleep_tail_missed_crash": tail_missed,
        "sleep_tail_lines": len(tail_out.splitlines()),
        "log_lines": len(full.splitlines()),
    }
    tb_gate = traceback_stats(evidence, full)
    tb_tail = traceback_stats(tail_out, full)
    run["traceback_lines"] = tb_gate.get("traceback_lines")
    run["exception"] = tb_gate.get("exception")
    run["gate_traceback_complete"] = tb_gate["traceback_complete"]
    run["sleep_tail_traceback_complete"] = tb_tail["traceback_complete"]
    run["sleep_tail_shows_exception"] = tb_tail["shows_exception"]
    return run


def crash_runs(backend: Any, repeats: int, port: int) -> list[dict[str, Any]]:
    """All scenarios; the slow one once (it costs 20 s more and its baseline outcome is fixed)."""
    runs = []
    for scenario in SCENARIOS:
        for i in range(1 if scenario == "slow_load_crash" else repeats):
            run = crash_run(backend, scenario, port)
            if run["gate_traceback_complete"]:
                evidence = "whole traceback"
            elif run["gate_traceback_complete"] is None:
                evidence = "no traceback (SIGKILL)"
            else:
                evidence = "TRACEBACK INCOMPLETE"
            tail = "missed the crash" if run["sleep_tail_missed_crash"] else f"{run['sleep_tail_detect_s']:.1f} s later"
            log(
                f"{backend.mode} {scenario} #{i + 1}: crash at {run['crash_since_start_s']} s, "
                f"gate failed {run['gate_detect_s']} s later ({evidence}), sleep+tail {tail}"
            )
            runs.append(run)
    return runs


def inside_main(args: argparse.Namespace) -> int:
    """Entry point inside the systemd container: run the systemd-mode crash bench, print JSON."""
    paths = {"serve": Path(args.serve), "model": Path(args.model)}
    work = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    backend = UnitBackend(paths, work, sys.executable)
    print(json.dumps(crash_runs(backend, args.repeats, args.port)))
    return 0


def run_systemd_mode(paths: dict[str, Path], repeats: int, port: int) -> list[dict[str, Any]] | None:
    """Start a systemd container sharing the venv, model and repository, run the bench inside."""
    if (
        not shutil.which("docker")
        or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0
    ):
        log(f"systemd mode skipped: docker or image {IMAGE} missing (tools/build-base-image)")
        return None
    real_python = Path(os.path.realpath(paths["python"]))
    prefix = real_python.parent.parent  # the interpreter's installation the venv points to
    name = f"gate-bench-{os.getpid()}"
    mounts = []
    for path in sorted({str(prefix), str(paths["serve"].parents[1]), str(paths["model"]), str(REPO)}):
        mounts += ["-v", f"{path}:{path}:ro"]
    argv = [
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--cap-add",
        "SYS_ADMIN",
        "--cgroupns",
        "host",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/run/lock",
        "-e",
        "container=docker",
        *mounts,
        IMAGE,
        "/lib/systemd/systemd",
    ]
    subprocess.run(argv, check=True, capture_output=True)
    try:
        for _ in range(100):
            state = subprocess.run(
                ["docker", "exec", name, "systemctl", "is-system-running"], capture_output=True, text=True
            ).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.2)
        log(f"systemd container {name} is {state}")
        proc = subprocess.run(
            [
                "docker",
                "exec",
                name,
                "/usr/bin/python3",
                str(ENTRY),
                "_inside",
                "--serve",
                str(paths["serve"]),
                "--model",
                str(paths["model"]),
                "--repeats",
                str(repeats),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
        )
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0:
            log(f"systemd mode failed (exit {proc.returncode})")
            return None
        return json.loads(proc.stdout)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-scenario figures for the results file."""
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        sel = [r for r in runs if r["scenario"] == scenario]
        if not sel:
            continue
        detects = [r["gate_detect_s"] for r in sel if r["gate_detect_s"] is not None]
        tails = [r["sleep_tail_detect_s"] for r in sel if r["sleep_tail_detect_s"] is not None]
        out[scenario] = {
            "runs": len(sel),
            "gate_detect_s_median": round(statistics.median(detects), 3) if detects else None,
            "gate_detect_s_max": round(max(detects), 3) if detects else None,
            "sleep_tail_detect_s_median": round(statistics.median(tails), 3) if tails else None,
            "sleep_tail_missed": sum(1 for r in sel if r["sleep_tail_missed_crash"]),
            "gate_traceback_complete": [r["gate_traceback_complete"] for r in sel],
            "sleep_tail_traceback_complete": [r["sleep_tail_traceback_complete"] for r in sel],
        }
    return out
