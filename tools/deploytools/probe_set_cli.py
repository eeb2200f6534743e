"""What a correctness probe set asks: its golden prompts and its seeded eval, and training data for the tiny model.

    tools/probe-set show roles/health_gate/files/probes/chat-general.json       # ids, digest, the eval
    tools/probe-set eval-items FILE                      # the eval, one JSON line a question
    tools/probe-set training-items FILE --count 4000     # other questions of the eval's families

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

from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.errors import GateUsageError
from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.probeset import eval_items, load_probe_set


def training_items(spec: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """``count`` questions per family of an eval spec, drawn from the seeds after the eval's own."""
    out: list[dict[str, Any]] = []
    offset = 1
    while len(out) < count * len(spec["families"]):
        out.extend(eval_items(spec, seed_offset=offset))
        offset += 1
    return out[: count * len(spec["families"])]


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and print what it asks for; 2 for a probe set that is not right."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["show", "eval-items", "training-items"])
    ap.add_argument("probe_set", type=Path, help="a probe set's JSON file")
    ap.add_argument("--count", type=int, default=2000, help="training-items: questions per family (default 2000)")
    args = ap.parse_args(argv)
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
