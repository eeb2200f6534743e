"""GPU acceptance on the GPU host: what SGLang says, at the model's real size (issue 46, item 4).

    gpu-acceptance --state S correctness [--name NAME] [--reference FILE] [--gate-arg ARG ...]
        [--timeout 570]

The plan of state ``S`` (from its manifest: NEXTN, the mamba extra buffer, the radix cache, as
ct129's) is started and gated with the correctness probe (``tools/health-gate --probe-set
chat-general --correctness always --min-eval-score 0``: dummy weights answer nothing right), in
turn:

1. ``first``: the plan as it is. Its gate asks the golden prompts, each consistency prompt as a
   miss after ``/flush_cache``, a hit and a repeat (cache hit against miss, determinism), and
   records the outputs: the reference of the steps below.
2. ``again``: the same plan started anew (``--load-format dummy`` weights are seeded: the same
   outputs are expected, else no comparison across launches means anything).
3. ``no-spec``: the plan without speculative decoding (no ``--speculative-*`` flags, no
   ``SGLANG_ENABLE_SPEC_V2``): greedy parity with and without NEXTN, judged with re-scoring.
4. with ``--reference FILE`` (another version's ``first`` report, e.g. 0.5.11's): this version's
   server re-scores that version's golden outputs (teacher forcing) and is compared with them.

Each step's gate report keeps the figures the role's defaults come from: per golden prompt the
first divergence, the drift of the reference's log-probabilities and the margin at the divergence;
per consistency prompt the cached tokens and where a hit or a repeat parted. The record goes to
``<state>/correctness-NAME.json``; the exit status is 0 when every step's server started and
answered the probe (its verdicts are the measurement, not a pass or fail of this command).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from .common import Plan, say, write_json
from .device import Device
from .measure import utc
from .processes import cmd_stop
from .upgrade import gate, switch

RUNNING = "running"
# What the probe is asked with on dummy weights: always (no last-known-good), no eval floor, and no
# relative speed gate against the reference (these steps measure answers; upgrade measures speed).
PROBE_ARGS = ["--probe-set", "chat-general", "--correctness", "always", "--min-eval-score", "0"]
PROBE_ARGS += ["--max-regression-pct", "0"]


def without_speculation(plan: Plan) -> Plan:
    """``plan`` with speculative decoding off: its ``--speculative-*`` flags (and their values) and
    ``SGLANG_ENABLE_SPEC_V2`` dropped, everything else as it was."""
    argv: list[str] = []
    skipping = False
    for word in plan.argv:
        if word.startswith("--"):
            skipping = word.split("=", 1)[0].startswith("--speculative-")
        if not skipping:
            argv.append(word)
    env = {k: v for k, v in plan.env.items() if k != "SGLANG_ENABLE_SPEC_V2"}
    return Plan(argv, env, [*plan.notes, "speculative decoding off (gpu-acceptance correctness)"])


def probe_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What a step's gate said of the answers: its correctness checks, reduced to the figures that
    set the role's defaults (drift, margins, divergences, cached tokens)."""
    report = result.get("report") or {}
    checks = {c["name"]: c for c in (report.get("verdict") or {}).get("correctness", {}).get("checks") or []}
    golden = checks.get("golden_outputs") or {}
    rows = golden.get("prompts") or []
    consistency = (checks.get("consistency") or {}).get("prompts") or []
    drifts = [row["drift"] for row in rows if row.get("drift") is not None]
    return {
        "passed": result.get("passed"),
        "reasons": report.get("reasons"),
        "golden_same": None if not rows else sum(1 for row in rows if row.get("same")),
        "golden_near_ties": None if not rows else sum(1 for row in rows if row.get("near_tie")),
        "golden_prompts": len(rows) or None,
        "drift_max": max(drifts) if drifts else None,
        "margins_at_divergence": [row.get("margin_at_divergence") for row in rows if not row.get("same")],
        "consistency": [
            {k: row.get(k) for k in ("id", "cached_tokens", "hit_differs_at", "repeat_differs_at", "near_tie")}
            for row in consistency
        ],
        "eval": (checks.get("eval_score") or {}).get("value"),
        "probe_s": (report.get("correctness") or {}).get("duration_s"),
        "accept_length": result.get("accept_length"),
    }


def step(dev: Device, name: str, plan: Plan, extra: list[str], timeout: float) -> dict[str, Any]:
    """Start ``plan`` as ``name``, gate it with ``extra``, stop it; the step's record."""
    record: dict[str, Any] = {"start": switch(dev, name, plan, timeout)}
    if record["start"]["ready"]:
        result = gate(dev, name, [*PROBE_ARGS, *extra], timeout)
        record["gate"] = probe_summary(result)
        record["report"] = (dev.load().get("gate") or {}).get(name, {}).get("report")
    cmd_stop(argparse.Namespace(name=name), dev)
    return record


def cmd_correctness(args: argparse.Namespace, dev: Device) -> int:
    """The steps of this module's docstring; the record in ``<state>/correctness-NAME.json``."""
    plan = dev.plan()
    out = dev.root / f"correctness-{args.name}.json"
    record: dict[str, Any] = {"name": args.name, "started": utc(time.time()), "argv": plan.argv}
    if dev.load().get("servers", {}).get(RUNNING):
        cmd_stop(argparse.Namespace(name=RUNNING), dev)
    say("correctness: the plan as it is (the reference of the steps after it)")
    record["first"] = step(dev, "first", plan, args.gate_arg, args.timeout)
    reference = dev.root / f"correctness-{args.name}-first.json"
    write_json(reference, record["first"].get("report") or {})
    against = ["--baseline", str(reference)]
    say("correctness: the same plan started again (seeded dummy weights: the same outputs)")
    record["again"] = step(dev, "again", plan, [*args.gate_arg, *against], args.timeout)
    say("correctness: without speculative decoding (greedy parity with and without NEXTN)")
    record["no_spec"] = step(dev, "no-spec", without_speculation(plan), [*args.gate_arg, *against], args.timeout)
    if args.reference:
        say(f"correctness: {args.reference}'s golden outputs re-scored by this version")
        other = ["--baseline", str(args.reference)]
        record["versus_reference"] = step(dev, "versus", plan, [*args.gate_arg, *other], args.timeout)
    record["ended"] = utc(time.time())
    write_json(out, record)
    say(f"correctness '{args.name}': record in {out}")
    started = [v for k, v in record.items() if isinstance(v, dict) and "start" in v]
    return 0 if all(s["start"]["ready"] and s.get("gate") for s in started) else 1
