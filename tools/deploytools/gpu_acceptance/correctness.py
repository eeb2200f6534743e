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
5. ``traffic``: the plan as it is, gated against ``first`` while ``--streams`` clients (default 8)
   send chat requests all along, as ct129's clients do while its gate runs.
6. ``perturbed`` (with ``--perturbed-model DIR``, e.g. ``tools/make-tiny-model --from MODEL
   --perturb 0.1``): the plan serving that other revision, gated against ``first``: a gate that
   passes it is a gate that cannot tell a damaged model.
7. ``setting`` (with ``--setting ARG``, repeatable, e.g. ``--setting=--quantization=fp8``):
   the plan with those server arguments added, gated against ``first``: a setting that changes the
   model's numbers past the bound (``--quantization fp8``) or its answers (a wrong ``--chat-template``)
   must be refused; one that stays within them (``--kv-cache-dtype fp8_e5m2`` on the trained model) passes
   (bench/results/correctness_trained_gpu.md).

``--gates N`` gates each started server N times (default 1): in ``first`` the first gate records
the reference and the others are compared with it, so a trained model's figures (margins, the
re-score KL, the paired eval, accept length) are measured over many gates per start.

``--steps`` runs some of them (``first``, ``again``, ``no-spec``, ``versus``, ``traffic``,
``perturbed``, ``setting``; default: the first three, and ``versus`` with ``--reference``), so that a host
whose sessions are limited in time can spread them over several calls: the record of the same
``--name`` is read back and each step's result replaces that step's only, and the steps after
``first`` compare with the ``first`` step recorded earlier. The record is written after each step
(a session cut short keeps the steps done).

Each step's gate report keeps the figures the role's defaults come from: per golden prompt the
first divergence, the drift of the reference's log-probabilities and the margin at the divergence;
per consistency prompt the cached tokens and where a hit or a repeat parted. The record goes to
``<state>/correctness-NAME.json``; the exit status is 0 when every step asked for started its
server and answered the probe (its verdicts are the measurement, not a pass or fail of this command).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from .common import AcceptanceError, Plan, say, write_json
from .device import Device
from .measure import probe, utc
from .processes import cmd_stop
from .upgrade import gate, switch

RUNNING = "running"
# What the probe is asked with on dummy weights: always (no last-known-good), no eval floor, and no
# relative speed gate against the reference (these steps measure answers; upgrade measures speed).
PROBE_ARGS = ["--probe-set", "chat-general", "--correctness", "always", "--min-eval-score", "0"]
PROBE_ARGS += ["--max-regression-pct", "0"]
# The steps, in the order they run, with the key of each one's result in the record.
STEPS = {
    "first": "first",
    "again": "again",
    "no-spec": "no_spec",
    "versus": "versus_reference",
    "traffic": "traffic",
    "perturbed": "perturbed",
    "setting": "setting",
}
# The steps that are not in the default set (each needs something more: a reference, a second model,
# server arguments, or minutes of traffic).
OPTIONAL_STEPS = ("versus", "traffic", "perturbed", "setting")
# The figures kept of each golden and each consistency row of a gate's correctness checks.
GOLDEN_FIELDS = ("id", "same", "first_divergence", "kl", "drift", "margin_at_divergence", "near_tie", "ok")
# The chat requests the background clients of the ``traffic`` step send, in turn.
TRAFFIC_PROMPTS = (
    "What is 417 + 385?",
    "Write a Python function that returns the squares of a list of numbers.",
    "A box holds 12 pencils. Ana buys 7 boxes and gives away 20 pencils. How many pencils does she have now?",
    "Explain in two sentences what a prefix cache is.",
)
CONSISTENCY_FIELDS = ("id", "cached_tokens", "hit_differs_at", "repeat_differs_at", "margin_at_divergence", "drift")
CONSISTENCY_FIELDS += ("near_tie", "ok")


def with_model(plan: Plan, model: Path) -> Plan:
    """``plan`` serving the model at ``model`` instead of its ``--model-path``, everything else as it was."""
    argv = list(plan.argv)
    if "--model-path" not in argv:
        raise AcceptanceError("the plan has no --model-path to replace")
    argv[argv.index("--model-path") + 1] = str(model)
    return Plan(argv, dict(plan.env), [*plan.notes, f"model {model} (gpu-acceptance correctness)"])


def with_arguments(plan: Plan, arguments: list[str]) -> Plan:
    """``plan`` with the server ``arguments`` added after its own (argparse: the last one of a flag wins)."""
    return Plan([*plan.argv, *arguments], dict(plan.env), [*plan.notes, f"with {' '.join(arguments)} (gpu-acceptance)"])


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
    kls = [row["kl"] for row in rows if row.get("kl") is not None]
    paired = checks.get("eval_score_vs_last_known_good") or {}
    eval_check = checks.get("eval_score") or {}
    return {
        "passed": result.get("passed"),
        "reasons": report.get("reasons"),
        "golden_same": None if not rows else sum(1 for row in rows if row.get("same")),
        "golden_near_ties": None if not rows else sum(1 for row in rows if row.get("near_tie")),
        "golden_prompts": len(rows) or None,
        "golden_share": golden.get("value"),
        "drift_max": max(drifts) if drifts else None,
        "kl_max": max(kls) if kls else None,
        "margins_at_divergence": [row.get("margin_at_divergence") for row in rows if not row.get("same")],
        "golden": [{k: row.get(k) for k in GOLDEN_FIELDS} for row in rows],
        "consistency": [{k: row.get(k) for k in CONSISTENCY_FIELDS} for row in consistency],
        "eval": eval_check.get("value"),
        "eval_correct": eval_check.get("correct"),
        "eval_count": eval_check.get("count"),
        "eval_paired": {k: paired.get(k) for k in ("worse", "better", "drop", "p_value", "ok")} if paired else None,
        "decisions": decision_figures(report.get("correctness") or {}),
        "probe_s": (report.get("correctness") or {}).get("duration_s"),
        "accept_length": result.get("accept_length"),
    }


class Traffic:
    """``streams`` clients that send greedy chat requests to ``url`` one after another until stopped."""

    def __init__(self, url: str, streams: int) -> None:
        self.url, self.streams = url, streams
        self.model = probe(url).get("model_id", "default")
        self.stop = threading.Event()
        self.requests = self.errors = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(streams)]

    def _client(self, number: int) -> None:
        turn = number
        while not self.stop.is_set():
            prompt = TRAFFIC_PROMPTS[turn % len(TRAFFIC_PROMPTS)]
            turn += 1
            body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 48}
            request = urllib.request.Request(
                self.url + "/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    response.read()
                ok = True
            except OSError:
                ok = False
            with self.lock:
                self.requests += 1
                self.errors += 0 if ok else 1

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=130)

    def figures(self) -> dict[str, int]:
        """What the clients sent while they ran."""
        return {"streams": self.streams, "requests": self.requests, "errors": self.errors}


def step(
    dev: Device,
    name: str,
    plan: Plan,
    extra: list[str],
    timeout: float,
    gates: int = 1,
    later: list[str] | None = None,
    streams: int = 0,
    reference: Path | None = None,
) -> dict[str, Any]:
    """Start ``plan`` as ``name``, gate it ``gates`` times (the first with ``extra``, the others with
    ``later``, default ``extra``), with ``streams`` background clients all along, stop it; the record.
    With ``reference``, the first gate's report is written there before the others run (they compare
    with it)."""
    t0 = time.time()
    record: dict[str, Any] = {"start": switch(dev, name, plan, timeout), "argv": plan.argv}
    if record["start"]["ready"]:
        traffic = Traffic(dev.server(name)["url"], streams) if streams else None
        with traffic or contextlib.nullcontext():
            result = gate(dev, name, [*PROBE_ARGS, *extra], timeout)
            record["gate"] = probe_summary(result)
            record["gate_s"] = result.get("seconds")
            record["report"] = (dev.load().get("gate") or {}).get(name, {}).get("report")
            if reference:
                write_json(reference, record["report"] or {})
            record["gates"] = []
            for index in range(2, gates + 1):
                more = gate(dev, name, [*PROBE_ARGS, *(extra if later is None else later)], timeout, f"{name}-{index}")
                record["gates"].append({**probe_summary(more), "gate_s": more.get("seconds")})
        if traffic:
            record["traffic"] = traffic.figures()
    cmd_stop(argparse.Namespace(name=name), dev)
    record["seconds"] = round(time.time() - t0, 1)
    return record


def chosen_steps(steps: str | None, reference: Any, perturbed: Any = None, setting: Any = None) -> list[str]:
    """The steps to run: ``steps`` (comma-separated, in the order given) or the default set in :data:`STEPS` order."""
    if not steps:
        return [s for s in STEPS if s not in OPTIONAL_STEPS or (s == "versus" and reference)]
    asked = [s.strip() for s in steps.split(",") if s.strip()]
    unknown = [s for s in asked if s not in STEPS]
    if unknown or not asked:
        named = ", ".join(unknown) or "(none)"
        raise AcceptanceError(f"--steps: unknown step(s) {named}; choose from {', '.join(STEPS)}")
    if "versus" in asked and not reference:
        raise AcceptanceError("--steps versus needs --reference FILE (another version's first-step report)")
    if "perturbed" in asked and not perturbed:
        raise AcceptanceError("--steps perturbed needs --perturbed-model DIR (another revision of the model)")
    if "setting" in asked and not setting:
        raise AcceptanceError("--steps setting needs --setting ARG (a server argument to add, e.g. --kv-cache-dtype)")
    return list(dict.fromkeys(asked))  # in the order asked, each once


def cmd_correctness(args: argparse.Namespace, dev: Device) -> int:
    """The steps of this module's docstring; the record in ``<state>/correctness-NAME.json``."""
    steps = chosen_steps(args.steps, args.reference, args.perturbed_model, args.setting)
    plan = dev.plan()
    out = dev.root / f"correctness-{args.name}.json"
    reference = dev.root / f"correctness-{args.name}-first.json"
    compared = set(steps) - {"first", "versus"}  # every other step is gated against first
    if compared and "first" not in steps and not reference.is_file():
        raise AcceptanceError(f"no first step recorded in {reference}: run --steps first before the others")
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
        "traffic": (f"the plan as it is, gated while {args.streams} clients send chat requests", plan, against),
        "perturbed": (
            f"another revision of the model ({args.perturbed_model}): the gate must refuse it",
            with_model(plan, args.perturbed_model) if args.perturbed_model else plan,
            against,
        ),
        "setting": (
            f"the plan with {' '.join(args.setting)}: the gate must refuse a setting that corrupts tokens",
            with_arguments(plan, args.setting),
            against,
        ),
    }
    for name in steps:
        words, step_plan, gate_args = runs[name]
        say(f"correctness: {words}")
        record[STEPS[name]] = step(
            dev,
            name,
            step_plan,
            gate_args,
            args.timeout,
            gates=args.gates,
            later=against if name == "first" else None,
            streams=args.streams if name == "traffic" else 0,
            reference=reference if name == "first" else None,
        )
        if name == "versus":
            record["reference"] = str(args.reference)
        record["ended"] = utc(time.time())
        write_json(out, record)
    say(f"correctness '{args.name}': record in {out}")
    done = [record[STEPS[name]] for name in steps]
    return 0 if all(s["start"]["ready"] and s.get("gate") for s in done) else 1
