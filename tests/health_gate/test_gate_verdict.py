"""The verdict in one place (llm_gate.verdict): what the module returns and adopt, the bake-off and
record_good read - the comparison with a reference server, the baseline the next deploy compares
with, and the verdict's parts."""

from __future__ import annotations

from typing import Any

import pytest
from gate_fakes import llm_gate

PROMPTS = [{"id": "a", "messages": [{"role": "user", "content": "x"}]}]
SETTINGS = {"requests": 8, "concurrency": 1, "max_tokens": 256, "prompts": ["a"], "warmup_requests": 2}


def cfg(**changes: Any) -> llm_gate.GateConfig:
    """A validated configuration (threshold 10 tok/s) with ``changes`` on top."""
    options = {
        "url": "http://127.0.0.1:1",
        "prompts": PROMPTS,
        "min_decode_tps": 10,
        "metadata": {"unit_sha256": "u2"},
        **{k: v for k, v in SETTINGS.items() if k != "prompts"},
    }
    options.update(changes)
    return llm_gate.validate_config(llm_gate.make_config(options))


def report(tps: float | None = 40.0, unit: str = "u2", **settings: Any) -> dict[str, Any]:
    """A measured report, before it is judged."""
    return {
        "timestamp": "t2",
        "metadata": {"unit_sha256": unit},
        "settings": dict(SETTINGS, fixed_output="ignore_eos", temperature=0, **settings),
        "aggregate": {"decode_tps_mean": tps, "ttft_p95_s": 0.5, "requests": 8},
        "speculative": {"accept_length": None},
        "capacity": {"effective_max_running_requests": None},
        "checks": [],
        "reasons": [],
        "notes": [],
        "passed": False,
    }


def judged(config: llm_gate.GateConfig, rep: dict[str, Any]) -> dict[str, Any]:
    llm_gate.judge(config, rep["aggregate"], {"value": None}, rep["capacity"], rep)
    return rep


# --- compare_reference: adoption's floor, the bake-off's lead ------------------------------------


@pytest.mark.parametrize(
    "value, base, share, ok, needed",
    [
        (45.0, 50.0, 0.9, True, 45.0),  # exactly the share
        (44.9, 50.0, 0.9, False, 45.0),
        (44.96, 50.0, 0.9, True, 45.0),  # compared as the words show them, to one decimal
        (None, 50.0, 0.9, False, 45.0),  # no figure counts as 0
        (1.0, 50.0, 0, True, 0.0),  # 0: off
        (1.0, None, 0.9, True, None),  # the by-hand server had no figure: nothing to hold it to
    ],
)
def test_a_min_share_is_a_floor(value, base, share, ok, needed):
    got = llm_gate.compare_reference(value, {"decode_tps_mean": base, "min_share": share})
    assert (got["ok"], got["needed"], got["min_share"]) == (ok, needed, share)
    assert "margin_pct" not in got


@pytest.mark.parametrize(
    "value, base, ok",
    [
        (55.1, 50.0, True),
        (55.0, 50.0, False),  # by more than the margin, not by it
        (80.0, None, False),  # no figure to beat: not kept
        (None, 50.0, False),
    ],
)
def test_a_margin_is_a_lead(value, base, ok):
    got = llm_gate.compare_reference(value, {"decode_tps_mean": base, "margin_pct": 10})
    assert got["ok"] is ok and got["margin_pct"] == 10.0
    assert got["needed"] == (55.0 if base else None)


def test_a_lead_must_be_more_than_the_margin():
    """40 x 1.25 is exactly 50.0: reaching it is not beating it."""
    assert llm_gate.compare_reference(50.0, {"decode_tps_mean": 40.0, "margin_pct": 25})["ok"] is False
    assert llm_gate.compare_reference(50.01, {"decode_tps_mean": 40.0, "margin_pct": 25})["ok"] is True


def test_the_reference_reports_share_and_change():
    got = llm_gate.compare_reference(42.0, {"decode_tps_mean": 40.0, "min_share": 0.5})
    assert (got["share"], got["change_pct"], got["value"], got["reference"]) == (1.05, 5.0, 42.0, 40.0)
    assert llm_gate.compare_reference(42.0, None) is None and llm_gate.compare_reference(42.0, {}) is None


@pytest.mark.parametrize(
    "reference, error",
    [
        ({"decode_tps_mean": 40}, "reference needs exactly one of min_share and margin_pct"),
        ({"decode_tps_mean": 40, "min_share": 0.9, "margin_pct": 5}, "reference needs exactly one of"),
        ({"decode_tps_mean": "fast", "min_share": 0.9}, "reference.decode_tps_mean must be a number, got 'fast'"),
        ({"decode_tps_mean": 40, "min_share": -1}, "reference.min_share must be 0 or more, got -1.0"),
        ({"decode_tps_mean": 40, "margin": 5}, "reference has unknown keys margin"),
        ("40", "reference must be a mapping"),
    ],
)
def test_bad_references_are_usage_errors(reference, error):
    with pytest.raises(llm_gate.GateUsageError, match=error):
        cfg(reference=reference)


def test_a_reference_from_ansible_strings_is_converted():
    assert cfg(reference={"decode_tps_mean": "40.5", "margin_pct": "10", "min_share": None}).reference == {
        "decode_tps_mean": 40.5,
        "margin_pct": 10.0,
    }
    assert cfg(reference={}).reference is None


# --- next_baseline: what record_good keeps -----------------------------------------------------


def test_the_same_unit_and_measurement_keep_the_recorded_baseline():
    figures = llm_gate.baseline_of(judged(cfg(), report(40.0, unit="u1")))
    kept = dict(figures, decode_tps_mean=50.0, timestamp="t1")
    assert llm_gate.next_baseline(kept, figures) == kept


@pytest.mark.parametrize(
    "kept_changes",
    [
        {"unit_sha256": "u0"},  # another unit
        {"requests": 4},  # another measurement
        {"fixed_output": None},
        {"prompts": ["b"]},
    ],
)
def test_another_unit_or_measurement_records_the_new_figures(kept_changes):
    figures = llm_gate.baseline_of(report(40.0, unit="u1"))
    kept = dict(figures, decode_tps_mean=50.0, timestamp="t1", **kept_changes)
    assert llm_gate.next_baseline(kept, figures) == figures


def test_without_a_kept_baseline_the_figures_are_recorded():
    figures = llm_gate.baseline_of(report(40.0))
    assert llm_gate.next_baseline(None, figures) == figures == llm_gate.next_baseline({}, figures)
    # a kept record without the unit (as record_good's "default('')") is not the same
    no_unit = {k: v for k, v in figures.items() if k != "unit_sha256"}
    assert llm_gate.next_baseline(no_unit, dict(figures, unit_sha256=None)) == dict(figures, unit_sha256=None)


# --- the verdict's parts ------------------------------------------------------------------------


def test_a_passing_verdict_carries_its_parts_and_the_next_baseline():
    rep = judged(cfg(reference={"decode_tps_mean": 38.0, "min_share": 0.9}), report(40.0))
    verdict = rep["verdict"]
    assert verdict["passed"] is rep["passed"] is True and verdict["reasons"] == []
    assert verdict["absolute"]["passed"] is True and [c["name"] for c in verdict["absolute"]["checks"]] == [
        "decode_tps"
    ]
    assert verdict["relative"] == {
        "passed": True,
        "compared": False,
        "checks": [],
        "reasons": [],
        "note": None,
        "baseline": None,
    }
    assert verdict["reference"]["ok"] is True and verdict["reference"]["needed"] == 34.2
    assert verdict["figures"] == llm_gate.baseline_of(rep) and verdict["baseline"] == verdict["figures"]


def test_a_failing_verdict_says_which_part_failed_and_records_nothing():
    baseline = dict(llm_gate.baseline_of(report(40.0, unit="u1")), fixed_output="ignore_eos")
    rep = judged(cfg(baseline=baseline, max_regression_pct=10), report(30.0))
    verdict = rep["verdict"]
    assert verdict["passed"] is False and verdict["baseline"] is None
    assert verdict["absolute"]["passed"] is True
    assert verdict["relative"]["passed"] is False and verdict["relative"]["compared"] is True
    assert verdict["relative"]["baseline"] == baseline
    assert verdict["reasons"] == rep["reasons"] == verdict["relative"]["reasons"]
    assert verdict["reasons"][0].startswith("decode 30.0 tok/s is 25.0 % below the last-known-good's 40.0")


def test_a_gate_that_failed_before_judging_has_a_verdict_without_parts():
    rep = dict(report(None), aggregate=None, reasons=["the server never became ready"])
    verdict = llm_gate.verdict_of(rep, cfg(reference={"decode_tps_mean": 38.0, "min_share": 0.9}))
    assert verdict == {
        "passed": False,
        "reasons": ["the server never became ready"],
        "absolute": None,
        "relative": None,
        "reference": None,
        "figures": None,
        "baseline": None,
        "correctness": None,
    }
