#!/usr/bin/env python3
"""Summarise ``gpu-acceptance correctness`` records: one row per step, the figures of every gate.

    python3 bench/gpu_trained/summarise.py LABEL=RECORD.json:STEP [...] > summary.json

Each argument names a step of a record (``correctness-NAME.json`` from the GPU host) under a label;
the output is a JSON list of rows: the step's start, its gates (passed, golden same / near ties,
re-score KL and drift, eval counts, the paired comparison, accept length, seconds, reasons) and the
golden margins of its first gate. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GATE_FIELDS = ("passed", "golden_same", "golden_near_ties", "kl_max", "drift_max", "eval_correct", "eval_count")
GATE_FIELDS += ("eval_paired", "accept_length", "margins_at_divergence", "reasons")


def gate_row(gate: dict[str, Any], seconds: float | None) -> dict[str, Any]:
    """The figures kept of one gate."""
    return {**{name: gate.get(name) for name in GATE_FIELDS}, "gate_s": seconds}


def step_row(label: str, record: dict[str, Any], step: str) -> dict[str, Any]:
    """One step of ``record``: its start, its gates and the first gate's margins."""
    data = record[step]
    gates = [gate_row(data["gate"], data.get("gate_s"))] if data.get("gate") else []
    gates += [gate_row(more, more.get("gate_s")) for more in data.get("gates", [])]
    first = data.get("gate") or {}
    return {
        "label": label,
        "step": step,
        "added_arguments": data["argv"][len(record["argv"]) :]
        if data["argv"][: len(record["argv"])] == record["argv"]
        else None,
        "model": data["argv"][data["argv"].index("--model-path") + 1],
        "start": data["start"],
        "traffic": data.get("traffic"),
        "seconds": data.get("seconds"),
        "passed": sum(1 for gate in gates if gate["passed"]),
        "gates": gates,
        "margins": (first.get("decisions") or {}).get("margin"),
    }


def main(argv: list[str]) -> int:
    """Print the rows of the steps named in ``argv`` (``LABEL=RECORD.json:STEP``)."""
    rows = []
    for word in argv:
        label, _, rest = word.partition("=")
        path, _, step = rest.rpartition(":")
        rows.append(step_row(label, json.loads(Path(path).read_text()), step))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
