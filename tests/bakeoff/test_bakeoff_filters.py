"""The bake-off's filters (filter_plugins/bakeoff.py): figures of a gate report, the table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("bakeoff_filters", REPO / "filter_plugins" / "bakeoff.py")
bakeoff = importlib.util.module_from_spec(_SPEC)  # type: ignore[arg-type]
sys.modules["bakeoff_filters"] = bakeoff
_SPEC.loader.exec_module(bakeoff)  # type: ignore[union-attr]


def report(tps: float, concurrency: int = 1, passed: bool = True) -> dict:
    return {
        "passed": passed,
        "summary": "gate PASS",
        "timestamp": "t",
        "metadata": {"unit_sha256": "u"},
        "aggregate": {"decode_tps_mean": tps, "ttft_p95_s": 0.1, "total_tps": tps * concurrency, "requests": 4},
        "settings": {"concurrency": concurrency},
        "speculative": None,
    }


def test_figures_of_a_report():
    assert bakeoff.bakeoff_figures(report(50.0, 2)) == {
        "passed": True,
        "decode_tps_mean": 50.0,
        "ttft_p95_s": 0.1,
        "total_tps": 100.0,
        "accept_length": None,
        "requests": 4,
        "concurrency": 2,
        "summary": "gate PASS",
        "timestamp": "t",
        "unit_sha256": "u",
        "reference": None,
        "right": None,
    }
    assert bakeoff.bakeoff_figures({}) == {} and bakeoff.bakeoff_figures(None) == {}
    # a candidate's trial gate carries its comparison with the incumbent: the bake-off reads it
    verdict = {"reference": {"ok": True, "value": 60.0, "reference": 50.0, "margin_pct": 10.0}}
    assert bakeoff.bakeoff_figures(dict(report(60.0), verdict=verdict))["reference"] == verdict["reference"]


def test_the_table_in_markdown():
    rows = [
        {
            "name": "last-known-good",
            "incumbent": True,
            "passed": True,
            "single": bakeoff.bakeoff_figures(report(40.0)),
            "concurrent": bakeoff.bakeoff_figures(report(30.0, 2)),
        },
        {
            "name": "dflash",
            "passed": True,
            "single": bakeoff.bakeoff_figures(report(50.0)),
            "concurrent": bakeoff.bakeoff_figures(report(35.0, 2)),
        },
        {"name": "broken", "passed": False, "single": {}, "concurrent": {}, "failure": "engine refused"},
    ]
    md = bakeoff.bakeoff_markdown(
        {
            "host": "h",
            "finished": "now",
            "concurrency": 2,
            "margin_pct": 10.0,
            "rows": rows,
            "decision": "dflash beat it",
        }
    )
    assert "| last-known-good (incumbent) | yes | - | 40.0 | 0.100 | - | 30.0 | 60.0 | 0.100 | - |" in md
    assert "| dflash | yes | - | 50.0 | 0.100 | - | 35.0 | 70.0 | 0.100 | +25.0 % |" in md
    assert "| broken | no | - | - | - | - | - | - | - | - |" in md
    assert "- broken: engine refused" in md and md.rstrip().endswith("Decision: dflash beat it")


def correctness_verdict(passed: bool, correct: int, golden_ok: int) -> dict:
    """A gate verdict's correctness part as llm_gate/verdict.py writes it."""
    prompts = [{"ok": n < golden_ok} for n in range(5)]
    return {
        "ran": True,
        "passed": passed,
        "reasons": [] if passed else ["golden outputs differ from the last-known-good's on 5 of 5 prompts"],
        "checks": [
            {"name": "golden_outputs", "prompts": prompts},
            {"name": "eval_score", "correct": correct, "count": 20},
        ],
    }


def test_a_faster_candidate_that_is_not_right_is_shown_so_with_why():
    right = dict(report(40.0), verdict={"correctness": correctness_verdict(True, 20, 5)})
    wrong = dict(report(80.0, passed=False), verdict={"correctness": correctness_verdict(False, 2, 0)})
    assert bakeoff.bakeoff_figures(right)["right"] == {"passed": True, "reasons": [], "eval": "20/20", "golden": "5/5"}
    rows = [
        {"name": "lkg", "incumbent": True, "passed": True, "single": bakeoff.bakeoff_figures(right), "concurrent": {}},
        {"name": "fast", "passed": False, "single": bakeoff.bakeoff_figures(wrong), "concurrent": {}},
    ]
    md = bakeoff.bakeoff_markdown({"host": "h", "concurrency": 2, "margin_pct": 10, "rows": rows, "decision": "d"})
    assert "| lkg (incumbent) | yes | yes (eval 20/20, golden 5/5) | 40.0 |" in md
    assert "| fast | no | no (eval 2/20, golden 0/5) | 80.0 |" in md
    assert "- fast: golden outputs differ from the last-known-good's on 5 of 5 prompts" in md


def test_the_plugin_exposes_both_filters():
    assert set(bakeoff.FilterModule().filters()) == {"bakeoff_figures", "bakeoff_markdown"}
