"""The relative gate: a changed deploy compared with the last-known-good's figures."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gate_fakes import llm_gate

PROMPTS = [
    {"id": "a", "messages": [{"role": "user", "content": "x"}]},
    {"id": "b", "messages": [{"role": "user", "content": "y"}]},
]
BASELINE = {
    "unit_sha256": "old",
    "decode_tps_mean": 40.0,
    "ttft_p95_s": 0.5,
    "accept_length": 2.0,
    "requests": 8,
    "concurrency": 1,
    "max_tokens": 256,
    "prompts": ["a", "b"],
}


def cfg(**changes: Any) -> llm_gate.GateConfig:
    """A validated gate configuration with the baseline above and a 10 % margin."""
    options = {
        "url": "http://127.0.0.1:1",
        "prompts": PROMPTS,
        "baseline": dict(BASELINE),
        "max_regression_pct": 10,
        "metadata": {"unit_sha256": "new"},
    }
    options.update(changes)
    return llm_gate.validate_config(llm_gate.make_config(options))


def compare(tps: float, ttft: float, accept: float | None = None, **changes: Any):
    return llm_gate.compare_baseline({"decode_tps_mean": tps, "ttft_p95_s": ttft}, {"value": accept}, cfg(**changes))


def test_within_the_margin_passes_and_reports_the_change():
    checks, reasons, note = compare(37.0, 0.52, 1.9)
    assert reasons == [] and note is None
    assert [(c["name"], c["change_pct"], c["ok"]) for c in checks] == [
        ("decode_tps_vs_last_known_good", -7.5, True),
        ("ttft_vs_last_known_good", 4.0, True),
        ("accept_length_vs_last_known_good", -5.0, True),
    ]


def test_each_figure_worse_than_the_margin_fails_with_its_sentence():
    _, reasons, _ = compare(30.0, 0.9, 1.5)
    assert reasons == [
        "decode 30.0 tok/s is 25.0 % below the last-known-good's 40.0 tok/s (max_regression_pct 10)",
        "TTFT p95 0.90 s is 80.0 % above the last-known-good's 0.50 s (max_regression_pct 10)",
        "accept length 1.50 is 25.0 % below the last-known-good's 2.00 (max_regression_pct 10)",
    ]


def test_faster_is_never_a_regression():
    _, reasons, _ = compare(80.0, 0.1, 3.0)
    assert reasons == []


def test_a_small_ttft_needs_an_absolute_slack_too():
    """0.05 s -> 0.08 s is +60 %, but only 30 ms: jitter, not a regression."""
    base = dict(BASELINE, ttft_p95_s=0.05)
    _, reasons, _ = compare(40.0, 0.08, baseline=base)
    assert reasons == []
    _, reasons, _ = compare(40.0, 0.08, baseline=base, regression_min_ttft_delta_s=0)
    assert reasons and reasons[0].startswith("TTFT p95 0.08 s is 60.0 % above")


@pytest.mark.parametrize(
    "changes, note",
    [
        (
            {"metadata": {"unit_sha256": "old"}},
            "not compared with the last-known-good: the unit is the last-known-good one",
        ),
        ({"requests": 4}, "not compared with the last-known-good: it was measured with another requests"),
        (
            {"max_tokens": 64, "concurrency": 2},
            "not compared with the last-known-good: it was measured with another concurrency, max_tokens",
        ),
    ],
)
def test_not_compared_when_nothing_changed_or_the_measurement_differs(changes, note):
    checks, reasons, got = compare(10.0, 9.0, **changes)
    assert (checks, reasons, got) == ([], [], note)


def test_a_baseline_of_another_warm_up_or_output_length_is_not_compared():
    """The warm-up decides what the prefix cache holds; fixed_output whether outputs stop at EOS."""
    warm = dict(BASELINE, warmup_requests=8, fixed_output="ignore_eos")

    def against(warmup: int, fixed: str | None):
        return llm_gate.compare_baseline(
            {"decode_tps_mean": 10.0, "ttft_p95_s": 0.5}, {"value": None}, cfg(baseline=warm, warmup_requests=warmup),
            None, fixed,
        )  # fmt: skip

    prefix = "not compared with the last-known-good: it was measured with another "
    assert against(2, "ignore_eos") == ([], [], prefix + "warmup_requests")
    assert against(8, None) == ([], [], prefix + "fixed_output")
    # the same measurement is compared (and 10 tok/s against 40 fails)
    _, reasons, note = against(8, "ignore_eos")
    assert note is None and reasons[0].startswith("decode 10.0 tok/s is 75.0 % below")
    # a baseline recorded before these settings existed is compared as before
    _, reasons, note = compare(10.0, 0.5, warmup_requests=2)
    assert note is None and reasons[0].startswith("decode 10.0 tok/s is 75.0 % below")


def test_off_without_a_baseline_or_a_margin():
    assert compare(10.0, 9.0, baseline=None) == ([], [], None)
    assert compare(10.0, 9.0, max_regression_pct=0) == ([], [], None)


def test_no_accept_length_on_either_side_is_not_compared():
    checks, _, _ = compare(40.0, 0.5, None)
    assert [c["name"] for c in checks] == ["decode_tps_vs_last_known_good", "ttft_vs_last_known_good"]


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"max_regression_pct": -1}, "max_regression_pct must be 0 (no check) or positive, got -1.0"),
        ({"baseline": "fast"}, "baseline must be a mapping of the last-known-good's figures"),
        ({"baseline": dict(BASELINE, decode_tps_mean="40")}, "baseline.decode_tps_mean must be a number, got '40'"),
    ],
)
def test_bad_relative_options_are_usage_errors(changes, error):
    with pytest.raises(llm_gate.GateUsageError, match=error.replace("(", r"\(").replace(")", r"\)")):
        cfg(**changes)


def test_a_report_gives_the_baseline_the_next_deploy_compares_with():
    settings = {
        "requests": 8,
        "concurrency": 1,
        "max_tokens": 256,
        "prompts": ["a", "b"],
        "warmup_requests": 8,
        "fixed_output": "ignore_eos",
    }
    report = {
        "metadata": {"unit_sha256": "u1"},
        "timestamp": "t",
        "aggregate": {"decode_tps_mean": 41.0, "ttft_p95_s": 0.4},
        "speculative": {"accept_length": 2.1},
        "capacity": {"effective_max_running_requests": 4, "requested": 4},
        "settings": dict(settings, temperature=0, api_key_set=False),
    }
    assert llm_gate.baseline_of(report) == {
        "unit_sha256": "u1",
        "decode_tps_mean": 41.0,
        "ttft_p95_s": 0.4,
        "accept_length": 2.1,
        "effective_max_running_requests": 4,
        "timestamp": "t",
        **settings,
        "correctness": None,
    }


def test_the_summary_line_carries_the_comparison():
    report = {
        "passed": False,
        "aggregate": {"decode_tps_mean": 30.0, "ttft_p95_s": 0.5, "requests": 8},
        "thresholds": {"min_decode_tps": 5, "max_ttft_s": 5},
        "checks": [{"name": "decode_tps_vs_last_known_good", "change_pct": -25.0}],
        "reasons": ["decode 30.0 tok/s is 25.0 % below the last-known-good's 40.0 tok/s (max_regression_pct 10)"],
    }
    assert llm_gate.summary_line(report) == (
        "gate FAIL: 30.0 tok/s decode (min 5), TTFT p95 0.50 s (max 5), vs last-known-good decode_tps -25.0 %, "
        "8 requests - decode 30.0 tok/s is 25.0 % below the last-known-good's 40.0 tok/s (max_regression_pct 10)"
    )
    assert json.dumps(report)  # plain data
