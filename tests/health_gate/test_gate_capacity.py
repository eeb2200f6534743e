"""Capacity as a gate: the requests SGLang's scheduler runs at once, against min_running_requests.

SGLang 0.5.17 starts even when its mamba state cache cannot hold --max-running-requests: it
caps the running requests (down to 1) and says so only in its log, where 0.5.11 refused to
start. A gate that sends one stream at a time passes such a server, so the gate reads
``internal_states[0].effective_max_running_requests_per_dp`` from /server_info after the
measurement. A real server cannot be made to cap itself on demand here, hence the fake
server's scripted /server_info.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from gate_fakes import base_options, llm_gate
from test_gate_rules import run_preflight

CAPPED_REASON = (
    "SGLang runs at most 1 request at once (server_info effective_max_running_requests_per_dp; 4 asked), "
    "below min_running_requests 4: its mamba state or KV cache is too small for the target concurrency "
    "(see the launch plan's memory budget)"
)
SOURCE = "server_info.internal_states[0].effective_max_running_requests_per_dp"


def sglang_info(effective: Any = None, requested: int = 4, **state: Any) -> dict[str, Any]:
    """A /server_info answer of SGLang asked for ``requested`` running requests and running ``effective``."""
    if effective is not None:
        state["effective_max_running_requests_per_dp"] = effective
    return {
        "version": "0.5.17",
        "max_running_requests": requested,
        "speculative_algorithm": None,
        "internal_states": [state],
    }


def running_check(report: dict[str, Any]) -> dict[str, Any]:
    """The report's ``running_requests`` check."""
    (check,) = [c for c in report["checks"] if c["name"] == "running_requests"]
    return check


def test_running_requests_capped_to_one_fail_the_gate_with_one_reason(fake_server):
    server = fake_server(server_info=sglang_info(1))
    report = llm_gate.run_gate(base_options(server.url, min_running_requests=4))
    assert not report["passed"]
    assert report["reasons"] == [CAPPED_REASON]
    assert report["capacity"] == {
        "effective_max_running_requests": 1,
        "requested": 4,
        "source": SOURCE,
        "note": None,
    }
    check = running_check(report)
    assert (check["value"], check["op"], check["limit"], check["ok"]) == (1, ">=", 4, False)
    assert report["thresholds"]["min_running_requests"] == 4
    assert "max running 1 (min 4)" in report["summary"]
    assert report["summary"].endswith(" - " + CAPPED_REASON)
    # /server_info is read twice in all: at discovery, and once after the measurement
    # (the accept length and the running requests share that one answer).
    assert [r["path"] for r in server.requests].count("/server_info") == 2
    assert json.dumps(report)


def test_four_running_requests_with_min_four_pass(fake_server):
    server = fake_server(server_info=sglang_info(4))
    report = llm_gate.run_gate(base_options(server.url, min_running_requests=4))
    assert report["passed"], report["reasons"]
    check = running_check(report)
    assert (check["value"], check["ok"], check["source"], check["requested"]) == (4, True, SOURCE, 4)
    assert "max running 4 (min 4)" in report["summary"]


def test_running_requests_are_reported_without_a_threshold(fake_server):
    server = fake_server(server_info=sglang_info(1))
    report = llm_gate.run_gate(base_options(server.url))
    assert report["passed"], report["reasons"]
    assert report["capacity"]["effective_max_running_requests"] == 1
    assert not [c for c in report["checks"] if c["name"] == "running_requests"]
    assert "max running 1 (min off)" in report["summary"]


@pytest.mark.parametrize(
    "info, note",
    [
        (
            sglang_info(None),
            "not applied: /server_info has no internal_states[0].effective_max_running_requests_per_dp",
        ),
        (
            {"version": "0.5.11", "max_running_requests": 4},
            "not applied: /server_info has no internal_states[0].effective_max_running_requests_per_dp",
        ),
        (None, "not applied: engine generic reports no running-request limit"),
    ],
    ids=["sglang-no-field", "sglang-no-internal-states", "generic"],
)
def test_unknown_running_requests_are_a_check_not_applied(fake_server, info, note):
    server = fake_server(server_info=info)
    report = llm_gate.run_gate(base_options(server.url, min_running_requests=4))
    assert report["passed"], report["reasons"]
    check = running_check(report)
    assert check["ok"] is None and check["value"] is None and check["note"] == note
    assert report["capacity"]["effective_max_running_requests"] is None
    assert "max running n/a (min 4)" in report["summary"]


def test_capacity_from_server_info_takes_only_whole_numbers():
    read = llm_gate.capacity_from_info
    assert read(sglang_info(4.0))["effective_max_running_requests"] == 4
    for bad in (True, 2.5, -1, "4"):
        assert read(sglang_info(bad))["effective_max_running_requests"] is None, bad
    assert read(None)["note"] == "/server_info did not answer"
    assert read(dict(sglang_info(8), dp_size=2))["note"] == "per data-parallel rank (dp_size 2)"


@pytest.mark.parametrize(
    "value, error",
    [
        (-1, "min_running_requests must be at least 0, got -1 (0: no check)"),
        (2.5, "min_running_requests must be an integer, got 2.5"),
        ("four", "min_running_requests must be an integer, got 'four'"),
    ],
)
def test_bad_min_running_requests_are_usage_errors(value, error):
    with pytest.raises(llm_gate.GateUsageError) as err:
        llm_gate.GateConfig.from_options({"min_running_requests": value})
    assert error in str(err.value)


@pytest.mark.parametrize(
    "value, problem",
    [
        ("-1", "health_gate_min_running_requests is -1, but it must be 0 (no check) or a number of requests at once"),
        (
            "2.5",
            "health_gate_min_running_requests is 2.5, but it must be a whole number, 0 (no check) or a number of "
            "requests at once",
        ),
    ],
)
def test_preflight_words_name_the_variable(value, problem):
    assert llm_gate.variable_problems({"min_running_requests": value}, "health_gate_") == [problem]
    assert llm_gate.variable_problems({"min_running_requests": "4"}, "health_gate_") == []


def test_role_preflight_refuses_a_negative_min_running_requests(tmp_path):
    python = ["-e", f"ansible_python_interpreter={sys.executable}"]
    results = run_preflight(tmp_path, *python, "-e", "health_gate_min_running_requests=-1")
    refusal = results["Check that the gate's limits and thresholds make sense"]
    assert refusal["failed"] is True
    assert refusal["msg"] == (
        "health_gate_min_running_requests is -1, but it must be 0 (no check) or a number of requests at once: "
        "correct it in the group_vars or host_vars that set it."
    )


# The relative gate: the running requests are a count the server was sized for, so any drop fails.
BASELINE = {
    "unit_sha256": "old",
    "decode_tps_mean": 40.0,
    "ttft_p95_s": 0.5,
    "effective_max_running_requests": 4,
    "requests": 8,
    "concurrency": 1,
    "max_tokens": 256,
}


def compare_running(running: int | None) -> tuple[list[dict[str, Any]], list[str], str | None]:
    cfg = llm_gate.GateConfig.from_options(
        {"baseline": BASELINE, "max_regression_pct": 10, "metadata": {"unit_sha256": "new"}}
    )
    capacity = {"effective_max_running_requests": running}
    return llm_gate.compare_baseline({"decode_tps_mean": 40.0, "ttft_p95_s": 0.5}, {"value": None}, cfg, capacity)


def test_any_drop_of_running_requests_from_the_last_known_good_fails():
    checks, reasons, _ = compare_running(3)  # -25 %, but even -1 request is a drop
    assert reasons == [
        "SGLang runs at most 3 requests at once, fewer than the last-known-good's 4 "
        "(server_info effective_max_running_requests_per_dp; any drop fails)"
    ]
    (check,) = [c for c in checks if c["name"] == "running_requests_vs_last_known_good"]
    assert (check["value"], check["baseline"], check["op"], check["limit"], check["ok"]) == (3, 4, ">=", 4, False)


def test_as_many_or_more_running_requests_than_the_last_known_good_pass():
    for running in (4, 8):
        checks, reasons, _ = compare_running(running)
        assert reasons == []
        assert [c["ok"] for c in checks if c["name"] == "running_requests_vs_last_known_good"] == [True]
    checks, reasons, _ = compare_running(None)  # unknown now: not compared
    assert reasons == [] and "running_requests_vs_last_known_good" not in [c["name"] for c in checks]


def test_bad_baseline_running_requests_are_usage_errors():
    with pytest.raises(llm_gate.GateUsageError, match="baseline.effective_max_running_requests must be a number"):
        llm_gate.GateConfig.from_options({"baseline": dict(BASELINE, effective_max_running_requests="4")})
