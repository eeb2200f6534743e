"""GPU acceptance on the GPU host: an engine upgrade as a gated candidate, kept or rolled back.

    gpu-acceptance --state RUNNING upgrade --candidate-state CANDIDATE [--candidate-plan FILE]
        [--baseline-gates 3 | --baseline FILE] [--baseline-only] [--max-regression-pct 10]
        [--min-running-requests N] [--gate-arg ARG ...] [--name NAME] [--timeout 570]

The server named ``running`` in ``--state`` (launched from that state's plan and ready) is the
last-known-good. Its baseline is measured first: ``--baseline-gates`` gates back to back, whose
decode tok/s spread ((max - min) / median) is the gate's own noise on this server, recorded
beside a third of the margin; the median gate's report is the baseline (``--baseline FILE``
takes an earlier one instead; ``--baseline-only`` stops there). Then the steps of
``playbooks/upgrade.yml`` on a systemd host, with processes instead of a unit: the running
server is stopped (SIGTERM to its session, as the unit's drain), the candidate's plan
(``--candidate-plan``, else the candidate state's manifest) starts from the candidate's own
venv, and the gate measures it against the baseline (``--max-regression-pct``) and the
capacity floor (``--min-running-requests``). A pass keeps the candidate (it stays running as
``running`` of the candidate state). A failure stops the candidate, starts the last-known-good
plan again (its venv and JIT caches untouched) and gates it against the same baseline:
``rolled_back``. The record goes to ``<state>/upgrade-NAME.json``; the exit status is 0 when
the upgrade ended serving (kept, or rolled back and the previous engine passed again), 1
otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request
from typing import Any

from .common import AcceptanceError, Plan, say, write_json
from .device import Device
from .measure import cmd_gate, utc
from .processes import cmd_stop, cmd_wait, launch_server

RUNNING = "running"


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / median in percent: the worst false regression between two of the runs."""
    if len(values) < 2 or not statistics.median(values):
        return None
    return round(100.0 * (max(values) - min(values)) / statistics.median(values), 2)


def gate(dev: Device, name: str, extra: list[str], timeout: float, label: str | None = None) -> dict[str, Any]:
    """Run the runner's gate step on server ``name``, its result kept under ``label`` (default the
    server's name: a label of its own keeps one server's several gates apart); return that result."""
    label = label or name
    if label != name:
        dev.set_server(label, dev.server(name))
    cmd_gate(argparse.Namespace(name=label, timeout=timeout, gate_args=extra), dev)
    return dev.load()["gate"][label]


def save_metrics(dev: Device, name: str) -> str | None:
    """SGLang's /metrics text after a gate (the series the monitoring rules read), beside the logs."""
    url = dev.server(name)["url"] + "/metrics"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
    except OSError as exc:
        say(f"no /metrics from '{name}': {exc}")
        return None
    path = dev.logs / f"metrics-{name}.txt"
    path.write_text(text)
    return str(path)


def measure_baseline(dev: Device, gates: int, extra: list[str], timeout: float) -> dict[str, Any]:
    """Gate the running server ``gates`` times; the median report is the baseline."""
    runs = []
    for index in range(gates):
        name = f"{RUNNING}-baseline-{index + 1}"
        result = gate(dev, RUNNING, extra, timeout, label=name)
        if not result.get("passed"):
            raise AcceptanceError(f"the running server failed its own gate ({name}): it is no baseline")
        runs.append(result)
    rates = [float(r["tps"]) for r in runs if r.get("tps")]
    median_run = sorted(runs, key=lambda r: float(r.get("tps") or 0))[len(runs) // 2]
    path = dev.root / "baseline.json"
    write_json(path, median_run["report"])
    return {
        "file": str(path),
        "gates": [
            {
                "decode_tps": r.get("tps"),
                "ttft_p95_s": ((r.get("report") or {}).get("aggregate") or {}).get("ttft_p95_s"),
                "accept_length": r.get("accept_length"),
                "seconds": r.get("seconds"),
            }
            for r in runs
        ],
        "decode_tps_spread_pct": spread_pct(rates),
    }


def switch(dev: Device, name: str, plan: Plan, timeout: float) -> dict[str, Any]:
    """Start ``plan`` as server ``name`` of ``dev`` and wait for it; the start's record."""
    launch_server(dev, name, plan)
    code = cmd_wait(argparse.Namespace(name=name, timeout=timeout, interval=1.0), dev)
    record = dev.server(name)
    return {"ready": code == 0, "ready_s": record.get("ready_s"), "died_s": record.get("died_s")}


def cmd_upgrade(args: argparse.Namespace, dev: Device) -> int:
    """Baseline, switch to the candidate, gate, keep or roll back (module docstring)."""
    candidate_dev = Device(args.candidate_state)
    candidate_plan = candidate_dev.plan(args.candidate_plan)
    running_plan = Plan.from_dict({"argv": dev.server(RUNNING)["argv"], "env": dev.plan().env})
    if running_plan.argv[0] == candidate_plan.argv[0] and not args.candidate_plan:
        raise AcceptanceError("the candidate runs from the running server's venv: nothing to upgrade")
    margin = float(args.max_regression_pct)
    record: dict[str, Any] = {
        "name": args.name,
        "started": utc(time.time()),
        "running_argv": running_plan.argv,
        "candidate_argv": candidate_plan.argv,
        "max_regression_pct": margin,
        "min_running_requests": args.min_running_requests,
    }
    out = dev.root / f"upgrade-{args.name}.json"
    if args.baseline:
        record["baseline"] = {"file": str(args.baseline), "gates": [], "decode_tps_spread_pct": None}
    else:
        say(f"baseline: {args.baseline_gates} gates of the running server")
        record["baseline"] = measure_baseline(dev, args.baseline_gates, args.gate_arg, args.timeout)
        record["metrics_running"] = save_metrics(dev, RUNNING)
    spread = record["baseline"]["decode_tps_spread_pct"]
    record["noise_ok"] = None if spread is None else spread < margin / 3
    say(f"gate noise: decode tok/s spread {spread} % against a third of the {margin} % margin")
    write_json(out, record)
    if args.baseline_only:
        say(f"baseline in {record['baseline']['file']}; nothing switched (--baseline-only)")
        return 0
    relative = [*args.gate_arg, "--baseline", str(record["baseline"]["file"]), "--max-regression-pct", str(margin)]
    relative += ["--min-running-requests", str(args.min_running_requests)]

    t_switch = time.time()
    cmd_stop(argparse.Namespace(name=RUNNING), dev)
    candidate_name = f"candidate-{args.name}"
    record["candidate_start"] = switch(candidate_dev, candidate_name, candidate_plan, args.timeout)
    passed = False
    if record["candidate_start"]["ready"]:
        result = gate(candidate_dev, candidate_name, relative, args.timeout)
        record["candidate_gate"] = summary(result)
        record["metrics_candidate"] = save_metrics(candidate_dev, candidate_name)
        passed = bool(result.get("passed"))
    if passed:
        candidate_dev.set_server(RUNNING, candidate_dev.server(candidate_name))
        record["verdict"] = "kept"
    else:
        cmd_stop(argparse.Namespace(name=candidate_name), candidate_dev)
        record["rollback_start"] = switch(dev, RUNNING, running_plan, args.timeout)
        if record["rollback_start"]["ready"]:
            result = gate(dev, RUNNING, relative, args.timeout, label=f"{RUNNING}-after-rollback")
            record["rollback_gate"] = summary(result)
        record["verdict"] = "rolled_back"
    record["switch_to_end_s"] = round(time.time() - t_switch, 1)
    record["ended"] = utc(time.time())
    write_json(out, record)
    say(f"upgrade '{args.name}': {record['verdict']}; record in {out}")
    serving = passed or bool((record.get("rollback_gate") or {}).get("passed"))
    return 0 if serving else 1


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one gate that the upgrade record keeps (the full report stays in state.json)."""
    report = result.get("report") or {}
    return {
        "passed": result.get("passed"),
        "decode_tps": result.get("tps"),
        "ttft_p95_s": (report.get("aggregate") or {}).get("ttft_p95_s"),
        "accept_length": result.get("accept_length"),
        "reasons": report.get("reasons"),
        "checks": report.get("checks"),
        "effective_max_running_requests": (report.get("capacity") or {}).get("effective_max_running_requests"),
        "seconds": result.get("seconds"),
    }
