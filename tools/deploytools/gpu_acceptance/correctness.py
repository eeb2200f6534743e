"""GPU acceptance on the GPU host: what SGLang says, at the model's real size (issue 46, item 4).

    gpu-acceptance --state S correctness [--name NAME] [--reference FILE] [--steps STEP,...]
        [--gate-arg ARG ...] [--timeout 570]

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

``--steps`` runs some of them (``first``, ``again``, ``no-spec``, ``versus``; default: the first
three, and ``versus`` with ``--reference``), so that a host whose sessions are limited in time can
spread them over several calls: the record of the same ``--name`` is read back and each step's
result replaces that step's only, and ``again`` and ``no-spec`` compare with the ``first`` step
recorded earlier. The record is written after each step (a session cut short keeps the steps done).

Each step's gate report keeps the figures the role's defaults come from: per golden prompt the
first divergence, the drift of the reference's log-probabilities and the margin at the divergence;
per consistency prompt the cached tokens and where a hit or a repeat parted. The record goes to
``<state>/correctness-NAME.json``; the exit status is 0 when every step asked for started its
server and answered the probe (its verdicts are the measurement, not a pass or fail of this command).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .common import AcceptanceError, Plan, say, write_json
from .device import Device
from .measure import utc
from .processes import cmd_stop
from .upgrade import gate, switch

RUNNING = "running"
# What the probe is asked with on dummy weights: always (no last-known-good), no eval floor, and no
# relative speed gate against the reference (these steps measure answers; upgrade measures speed).
PROBE_ARGS = ["--probe-set", "chat-general", "--correctness", "always", "--min-eval-score", "0"]
PROBE_ARGS += ["--max-regression-pct", "0"]
# The steps, in the order they run, with the key of each one's result in the record.
STEPS = {"first": "first", "again": "again", "no-spec": "no_spec", "versus": "versus_reference"}
# The figures kept of each golden and each consistency row of a gate's correctness checks.
GOLDEN_FIELDS = ("id", "same", "first_divergence", "drift", "margin_at_divergence", "near_tie", "ok")
CONSISTENCY_FIELDS = ("id", "cached_tokens", "hit_differs_at", "repeat_differs_at", "margin_at_divergence", "drift")
CONSISTENCY_FIELDS += ("near_tie", "ok")


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


def spread(values: list[float]) -> dict[str, float] | None:
    """The lowest, 10th percentile, median, 90th percentile and highest of ``values`` (None when empty)."""
    ordered = sorted(values)
    if not ordered:
        return None
    at = {"min": 0.0, "p10": 0.1, "median": 0.5, "p90": 0.9, "max": 1.0}
    return {name: ordered[round(q * (len(ordered) - 1))] for name, q in at.items()}


def decision_figures(probe: dict[str, Any]) -> dict[str, Any]:
    """How sure the server was of its own greedy choices in the golden pass: the spread of the margin
    (top-1 minus top-2 log-probability) over every generated token, and of the chosen tokens'
    log-probabilities. A margin far below ``tie_margin`` everywhere (dummy weights: near-uniform
    logits) makes every divergence a near-tie, whatever its cause."""
    golden = (probe.get("golden") or {}).values()
    margins = [m for out in golden for m in out.get("margins") or [] if m is not None]
    chosen = [v for out in golden for v in out.get("logprobs") or [] if v is not None]
    return {"tokens": len(margins), "margin": spread(margins), "chosen_logprob": spread(chosen)}


def probe_summary(result: dict[str, Any]) -> dict[str, Any]:
    """What a step's gate said of the answers: its correctness checks, reduced to the figures that
    set the role's defaults (per golden prompt the first divergence, the drift and the margin there;
    per consistency prompt the cached tokens and where a hit or a repeat parted)."""
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
        "golden_share": golden.get("value"),
        "drift_max": max(drifts) if drifts else None,
        "margins_at_divergence": [row.get("margin_at_divergence") for row in rows if not row.get("same")],
        "golden": [{k: row.get(k) for k in GOLDEN_FIELDS} for row in rows],
        "consistency": [{k: row.get(k) for k in CONSISTENCY_FIELDS} for row in consistency],
        "eval": (checks.get("eval_score") or {}).get("value"),
        "decisions": decision_figures(report.get("correctness") or {}),
        "probe_s": (report.get("correctness") or {}).get("duration_s"),
        "accept_length": result.get("accept_length"),
    }


def step(dev: Device, name: str, plan: Plan, extra: list[str], timeout: float) -> dict[str, Any]:
    """Start ``plan`` as ``name``, gate it with ``extra``, stop it; the step's record."""
    t0 = time.time()
    record: dict[str, Any] = {"start": switch(dev, name, plan, timeout), "argv": plan.argv}
    if record["start"]["ready"]:
        result = gate(dev, name, [*PROBE_ARGS, *extra], timeout)
        record["gate"] = probe_summary(result)
        record["gate_s"] = result.get("seconds")
        record["report"] = (dev.load().get("gate") or {}).get(name, {}).get("report")
    cmd_stop(argparse.Namespace(name=name), dev)
    record["seconds"] = round(time.time() - t0, 1)
    return record


def chosen_steps(steps: str | None, reference: Any) -> list[str]:
    """The steps to run, in :data:`STEPS` order: ``steps`` (comma-separated) or the default set."""
    if not steps:
        return [s for s in STEPS if s != "versus" or reference]
    asked = [s.strip() for s in steps.split(",") if s.strip()]
    unknown = [s for s in asked if s not in STEPS]
    if unknown or not asked:
        named = ", ".join(unknown) or "(none)"
        raise AcceptanceError(f"--steps: unknown step(s) {named}; choose from {', '.join(STEPS)}")
    if "versus" in asked and not reference:
        raise AcceptanceError("--steps versus needs --reference FILE (another version's first-step report)")
    return [s for s in STEPS if s in asked]


def cmd_correctness(args: argparse.Namespace, dev: Device) -> int:
    """The steps of this module's docstring; the record in ``<state>/correctness-NAME.json``."""
    steps = chosen_steps(args.steps, args.reference)
    plan = dev.plan()
    out = dev.root / f"correctness-{args.name}.json"
    reference = dev.root / f"correctness-{args.name}-first.json"
    if {"again", "no-spec"} & set(steps) and "first" not in steps and not reference.is_file():
        raise AcceptanceError(f"no first step recorded in {reference}: run --steps first before again or no-spec")
    record: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {"name": args.name}
    record.update(started=utc(time.time()), argv=plan.argv, steps=steps)
    if dev.load().get("servers", {}).get(RUNNING):
        cmd_stop(argparse.Namespace(name=RUNNING), dev)
    against = [*args.gate_arg, "--baseline", str(reference)]
    # Each step: what it says, the plan it starts, the gate's arguments.
    runs = {
        "first": ("the plan as it is (the reference of the steps after it)", plan, args.gate_arg),
        "again": ("the same plan started again (seeded dummy weights: the same outputs)", plan, against),
        "no-spec": (
            "without speculative decoding (greedy parity with and without NEXTN)",
            without_speculation(plan),
            against,
        ),
        "versus": (
            f"{args.reference}'s golden outputs re-scored by this version",
            plan,
            [*args.gate_arg, "--baseline", str(args.reference)],
        ),
    }
    for name in steps:
        words, step_plan, gate_args = runs[name]
        say(f"correctness: {words}")
        record[STEPS[name]] = step(dev, name, step_plan, gate_args, args.timeout)
        if name == "first":
            write_json(reference, record["first"].get("report") or {})
        if name == "versus":
            record["reference"] = str(args.reference)
        record["ended"] = utc(time.time())
        write_json(out, record)
    say(f"correctness '{args.name}': record in {out}")
    done = [record[STEPS[name]] for name in steps]
    return 0 if all(s["start"]["ready"] and s.get("gate") for s in done) else 1
