"""What a correctness probe set asks: its golden prompts and its seeded eval, and training data for the tiny model.

    tools/probe-set show roles/health_gate/files/probes/chat-general.json       # ids, digest, the eval
    tools/probe-set eval-items FILE                      # the eval, one JSON line a question
    tools/probe-set training-items FILE --count 4000     # other questions of the eval's families
    tools/probe-set power-table                          # what each profile's eval comparison refuses

``power-table`` prints docs/health-gate.md's table, "How the eval is compared": for each profile
(group_vars/rehearsal.yml, group_vars/sglang_servers.yml over the role's defaults), its probe
set's number of questions, margin and confidence, the exact probability that the paired rule
(llm_gate.eval_compare) fails an unchanged server, and the smallest drop of accuracy it refuses
with 90 % probability, for references that answer 100, 90 and 80 % right.

``training-items`` draws ``--count`` questions per family from seeds after the eval's own (the
same families and templates, not the eval's items): what ``make tiny-model-train`` teaches the
rehearsal model (tools/make-tiny-model --train). A probe set's format: docs/health-gate.md,
"Correctness" (the package llm_gate.probeset checks it, as the gate does).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.errors import GateUsageError
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.eval_compare import (
    refusal_probability,
    smallest_refused_drop,
)
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.probeset import eval_items, load_probe_set

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "health_gate"
# The profiles whose eval comparison the table shows: an inventory group and what it serves.
PROFILES = (("rehearsal", "the CPU rehearsal (sim)"), ("sglang_servers", "SGLang on a GPU host (ct129)"))
REFERENCE_ACCURACIES = (1.0, 0.9, 0.8)
POWER = 0.9


def training_items(spec: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` questions per family of an eval spec, drawn from the seeds after the eval's own."""
    out: list[dict[str, Any]] = []
    offset = 1
    while len(out) < count * len(spec["families"]):
        out.extend(eval_items(spec, seed_offset=offset))
        offset += 1
    return out[: count * len(spec["families"])]


def profile_settings(group: str) -> dict[str, Any]:
    """A profile's eval settings: its group_vars over the role's defaults, and its probe set's size."""
    settings = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    settings.update(yaml.safe_load((REPO / "group_vars" / f"{group}.yml").read_text()) or {})
    probe = load_probe_set(str(ROLE / "files" / "probes" / f"{settings['health_gate_probe_set']}.json"))
    assert probe is not None
    return {
        "probe_set": probe["name"],
        "questions": len(probe["eval_items"]),
        "margin_pct": float(settings["health_gate_eval_margin_pct"]),
        "confidence": float(settings["health_gate_eval_confidence"]),
    }


def _pct(value: float | None) -> str:
    """``12 points``, or ``none`` where not even a candidate that answers nothing right is refused."""
    return "none" if value is None else f"{round(value * 100):d} points"


def power_table() -> str:
    """docs/health-gate.md's table of what each profile's eval comparison refuses (computed exactly)."""
    lines = [
        "| profile | eval | margin | reference answers right | an unchanged server fails | a candidate as accurate, "
        "answers drawn anew, fails | smallest drop refused 90 % of the time: answers drawn anew | "
        "the reference's answers lost |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for group, what in PROFILES:
        s = profile_settings(group)
        n, margin, confidence = s["questions"], s["margin_pct"], s["confidence"]
        for accuracy in REFERENCE_ACCURACIES:
            same = refusal_probability(n, accuracy, accuracy, margin, confidence)
            drawn = smallest_refused_drop(n, accuracy, margin, confidence, "independent", POWER)
            lost = smallest_refused_drop(n, accuracy, margin, confidence, "degraded", POWER)
            lines.append(
                f"| {group}: {what} | {s['probe_set']}, {n} questions | {margin:g} points at {confidence:g} | "
                f"{accuracy:.0%} | never | {same:.1%} | {_pct(drawn)} | {_pct(lost)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and print what it asks for; 2 for a probe set that is not right."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["show", "eval-items", "training-items", "power-table"])
    ap.add_argument("probe_set", type=Path, nargs="?", help="a probe set's JSON file (not for power-table)")
    ap.add_argument("--count", type=int, default=2000, help="training-items: questions per family (default 2000)")
    args = ap.parse_args(argv)
    if args.command == "power-table":
        print(power_table())
        return 0
    if args.probe_set is None:
        ap.error(f"{args.command} needs a probe set's JSON file")
    try:
        probe = load_probe_set(str(args.probe_set))
    except GateUsageError as exc:
        print(f"probe-set: {exc}", file=sys.stderr)
        return 2
    assert probe is not None
    if args.command == "show":
        print(f"{probe['name']} version {probe['version']} (sha256 {probe['digest'][:12]})")
        print("golden: " + ", ".join(p["id"] for p in probe["golden_prompts"]))
        print("consistency: " + ", ".join((probe.get("consistency") or {}).get("items") or []))
        for item in probe["eval_items"]:
            print(f"  {item['id']}: {item['messages'][-1]['content']} -> {item['answer']}")
        return 0
    items = probe["eval_items"] if args.command == "eval-items" else training_items(probe["eval"], args.count)
    for item in items:
        print(json.dumps(item, sort_keys=True))
    return 0
