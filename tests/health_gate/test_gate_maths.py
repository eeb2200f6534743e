"""Measurement maths, option checks, prompts, redaction and report storage of the gate."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from gate_fakes import ROLE, llm_gate


def result(index, ttft, token_times, completion_tokens, t0=0.0):
    """A RequestResult built the way stream_chat builds it."""
    r = llm_gate.RequestResult(index, f"p{index}")
    r.ttft_s = ttft
    r.completion_tokens = completion_tokens
    r.prompt_tokens = 10
    r.content_chunks = len(token_times)
    r.e2e_s = token_times[-1] - t0 + 0.01
    r.decode_s = token_times[-1] - token_times[0]
    r.decode_tps = llm_gate.decode_tps(completion_tokens, token_times[0], token_times[-1])
    r.gaps = [b - a for a, b in zip(token_times, token_times[1:], strict=False)]
    return r


@pytest.mark.parametrize(
    "values,pct,expected",
    [
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 95, 3.85),
        ([4, 1, 3, 2], 0, 1),
        ([4, 1, 3, 2], 100, 4),
        ([7.0], 95, 7.0),
        ([10, 20], 25, 12.5),
    ],
)
def test_percentile_interpolates_between_ranks(values, pct, expected):
    assert llm_gate.percentile(values, pct) == pytest.approx(expected)


def test_percentile_of_nothing_is_none():
    assert llm_gate.percentile([], 95) is None


def test_decode_tps_counts_tokens_after_the_first():
    # 21 tokens: the first at 1.0 s, the last at 1.4 s -> 20 tokens in 0.4 s.
    assert llm_gate.decode_tps(21, 1.0, 1.4) == pytest.approx(50.0)
    assert llm_gate.decode_tps(1, 1.0, 1.4) is None
    assert llm_gate.decode_tps(5, 2.0, 2.0) is None


def test_aggregate_is_the_mean_of_per_request_figures_and_total_is_tokens_over_wall():
    a = result(0, 0.1, [0.1 + 0.02 * i for i in range(11)], 11)  # 10 / 0.2 = 50 tok/s
    b = result(1, 0.3, [0.3 + 0.1 * i for i in range(5)], 9)  # 8 / 0.4 = 20 tok/s (2 tokens/chunk)
    c = result(2, 0.2, [0.2], 1)  # one token: no decode figure
    agg = llm_gate.aggregate([a, b, c], wall_s=2.0)
    assert agg["decode_tps_mean"] == pytest.approx(35.0)
    assert agg["decode_tps_median"] == pytest.approx(35.0)
    assert agg["decode_tps_min"] == pytest.approx(20.0)
    assert agg["requests_with_decode"] == 2
    assert agg["completion_tokens"] == 21
    assert agg["total_tps"] == pytest.approx(10.5)
    assert agg["ttft_p50_s"] == pytest.approx(0.2)
    assert agg["ttft_p95_s"] == pytest.approx(0.29)
    # 10 gaps of 20 ms and 4 of 100 ms, pooled
    assert agg["itl_mean_s"] == pytest.approx((10 * 0.02 + 4 * 0.1) / 14, abs=1e-4)
    assert agg["tokens_per_chunk"] == pytest.approx(21 / 17, abs=1e-3)


def cfg(**over):
    base = llm_gate.validate_config(
        llm_gate.make_config({"min_decode_tps": 40, "max_ttft_s": 3.0, "min_accept_length": 1.5})
    )
    return dataclasses.replace(base, **over)


def test_evaluate_passes_when_every_figure_is_within_its_threshold():
    checks, reasons = llm_gate.evaluate(
        {"decode_tps_mean": 52.3, "ttft_p95_s": 0.41}, {"value": 2.1, "source": "server_info"}, cfg()
    )
    assert reasons == []
    assert [c["name"] for c in checks] == ["decode_tps", "ttft", "accept_length"]
    assert all(c["ok"] for c in checks)


def test_evaluate_names_every_failed_threshold():
    checks, reasons = llm_gate.evaluate(
        {"decode_tps_mean": 31.0, "ttft_p95_s": 4.2}, {"value": 1.02, "source": "generate"}, cfg()
    )
    assert len(reasons) == 3
    assert "31.0 tok/s is below min_decode_tps 40" in reasons[0]
    assert "TTFT p95 4.20 s is above max_ttft_s 3" in reasons[1]
    assert "accept length 1.02 is below min_accept_length 1.5" in reasons[2]


def test_accept_length_threshold_only_applies_when_the_engine_reports_one():
    checks, reasons = llm_gate.evaluate(
        {"decode_tps_mean": 50.0, "ttft_p95_s": 0.5},
        {"value": None, "note": "engine generic reports no accept length"},
        cfg(),
    )
    assert reasons == []
    accept = [c for c in checks if c["name"] == "accept_length"][0]
    assert accept["ok"] is None and "not applied" in accept["note"]


def test_zero_thresholds_disable_checks_and_unknown_decode_speed_fails():
    checks, reasons = llm_gate.evaluate(
        {"decode_tps_mean": None, "ttft_p95_s": 99.0}, {"value": None}, cfg(max_ttft_s=0.0, min_accept_length=0.0)
    )
    assert [c["name"] for c in checks] == ["decode_tps"]
    assert "decode speed unknown" in reasons[0]


def test_summary_line_reads_like_the_issue_example():
    report = {
        "passed": True,
        "aggregate": {"decode_tps_mean": 52.34, "ttft_p95_s": 0.412, "requests": 8},
        "thresholds": {"min_decode_tps": 40.0, "max_ttft_s": 3.0, "min_accept_length": 1.5},
        "speculative": {"accept_length": 2.1},
    }
    assert llm_gate.summary_line(report) == (
        "gate PASS: 52.3 tok/s decode (min 40), TTFT p95 0.41 s (max 3), accept 2.10 (min 1.5), 8 requests"
    )
    report.update(passed=False, reasons=["decode 31.0 tok/s is below min_decode_tps 40"])
    assert llm_gate.summary_line(report).startswith("gate FAIL: ")
    assert llm_gate.summary_line(report).endswith("- decode 31.0 tok/s is below min_decode_tps 40")


def test_summary_line_before_measurement_names_the_phase():
    line = llm_gate.summary_line(
        {"passed": False, "phase": "loading", "aggregate": None, "reasons": ["unit x.service failed"]}
    )
    assert line == "gate FAIL (loading): unit x.service failed"


@pytest.mark.parametrize(
    "options,fragment",
    [
        ({"requests": 0}, "requests must be at least 1"),
        ({"concurrency": 0}, "concurrency must be at least 1"),
        ({"warmup_requests": -1}, "warmup_requests must be at least 0"),
        ({"max_tokens": 1}, "max_tokens must be at least 2"),
        ({"min_decode_tps": -5}, "min_decode_tps must be 0 (no check) or positive"),
        ({"max_ttft_s": -0.1}, "max_ttft_s must be 0 (no check) or positive"),
        ({"min_accept_length": -1}, "min_accept_length must be 0"),
        ({"ready_timeout_s": 0}, "ready_timeout_s must be greater than 0"),
        ({"request_timeout_s": "soon"}, "request_timeout_s must be a number"),
        ({"url": "localhost:30000"}, "url must look like http://HOST:PORT"),
        ({"url": "http://127.0.0.1:99999"}, "invalid port"),
        ({"engine": "vllm"}, "engine must be one of"),
        ({"unit": "x", "pid": 12}, "either a unit or a pid"),
        ({"keep_reports": 0}, "keep_reports must be at least 1"),
        ({"prompts": [{"messages": "hi"}]}, "prompt 0 must be a string or a mapping"),
        ({"prompts": "/nonexistent/prompts.json"}, "cannot read prompts"),
        ({"requests": 2.5}, "requests must be an integer"),
    ],
)
def test_bad_options_are_usage_errors(options, fragment):
    with pytest.raises(llm_gate.GateUsageError) as err:
        llm_gate.validate_config(llm_gate.make_config(options))
    assert fragment in str(err.value)


def test_all_usage_errors_are_reported_at_once():
    with pytest.raises(llm_gate.GateUsageError) as err:
        llm_gate.validate_config(llm_gate.make_config({"requests": 0, "min_decode_tps": -1}))
    assert "requests" in str(err.value) and "min_decode_tps" in str(err.value)


def test_validated_options_are_a_frozen_config_with_numbers_and_prompts_loaded():
    options = llm_gate.make_config({"requests": "4", "min_decode_tps": 40})
    config = llm_gate.validate_config(options)
    assert isinstance(config, llm_gate.GateConfig)
    assert config.requests == 4 and config.min_decode_tps == 40.0
    assert config.prompt_ids == [p["id"] for p in llm_gate.FALLBACK_PROMPTS]
    assert options["requests"] == "4"  # the caller's options are left as they were
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.requests = 8  # type: ignore[misc]
    # one list of options: the defaults are the config's own
    assert llm_gate.DEFAULTS == dataclasses.asdict(llm_gate.GateConfig())


def test_run_gate_rejects_bad_options_before_touching_the_server():
    # Port 9 (discard) on localhost: a usage error must come back without any request.
    with pytest.raises(llm_gate.GateUsageError):
        llm_gate.run_gate({"url": "http://127.0.0.1:9", "requests": 0})


def test_shipped_prompts_are_realistic_coding_prompts():
    prompts = llm_gate.load_prompts(str(ROLE / "files" / "prompts.json"))
    assert len(prompts) >= 8
    ids = [p["id"] for p in prompts]
    assert len(set(ids)) == len(ids)
    for p in prompts:
        user = [m["content"] for m in p["messages"] if m["role"] == "user"]
        assert user and len(user[0]) > 150, p["id"]
    joined = " ".join(m["content"] for p in prompts for m in p["messages"])
    for language in ("Python", "Go", "Rust", "SQL", "Bash"):
        assert language in joined


def test_prompts_accept_strings_and_message_lists():
    prompts = llm_gate.load_prompts(["write a function", {"id": "x", "messages": [{"role": "user", "content": "y"}]}])
    assert prompts[0]["messages"] == [{"role": "user", "content": "write a function"}]
    assert prompts[1]["id"] == "x"


def test_redaction_hides_the_key_and_key_looking_values():
    text = (
        "server_args=ServerArgs(model_path='/m', api_key='sk-secret-1', port=30000)\n"
        "cmd: sglang serve --api-key sk-secret-1 --port 30000\nAuthorization: Bearer abc.def\n"
        "api_key=None"
    )
    out = llm_gate.redact_text(text, ["sk-secret-1"])
    assert "sk-secret-1" not in out and "abc.def" not in out
    assert "api_key='***'" in out and "api_key=None" in out
    nested = llm_gate.redact({"a": ["x sk-secret-1 y", {"b": "sk-secret-1"}], "n": 3}, ["sk-secret-1"])
    assert json.dumps(nested).count("sk-secret-1") == 0 and nested["n"] == 3


def test_cap_lines_keeps_the_end_and_says_so():
    text = "\n".join(f"line {i}" for i in range(5000))
    out, lines, capped = llm_gate.cap_lines(text, 100, 1 << 20)
    assert capped and lines == 100 and out.endswith("line 4999") and out.startswith("line 4900")
    out, lines, capped = llm_gate.cap_lines(text, 10000, 2048)
    assert capped and len(out.encode()) <= 2048 and out.endswith("line 4999")
    out, lines, capped = llm_gate.cap_lines("a\nb", 10, 1024)
    assert not capped and lines == 2


def test_last_exception_line_finds_the_raised_error():
    log = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "    raise ValueError('Speculative decoding is not compatible')",
        "ValueError: Speculative decoding is not compatible",
        "[2026] Received sigquit",
    ]
    assert llm_gate.last_exception_line("\n".join(log)) == "ValueError: Speculative decoding is not compatible"
    assert (
        llm_gate.last_exception_line("torch.OutOfMemoryError: CUDA out of memory")
        == "torch.OutOfMemoryError: CUDA out of memory"
    )
    assert llm_gate.last_exception_line("all good\nserver ready") is None


def test_store_report_writes_history_and_latest_and_prunes(tmp_path):
    d = tmp_path / "gate"
    paths = []
    for minute in range(5):
        report = {"timestamp": f"2026-11-29T22:{minute:02d}:00Z", "passed": minute % 2 == 0}
        paths.append(llm_gate.store_report(report, str(d), keep=3))
    names = sorted(os.listdir(d))
    assert names == ["20261129T220200Z.json", "20261129T220300Z.json", "20261129T220400Z.json", "latest.json"]
    assert json.loads((d / "latest.json").read_text())["timestamp"] == "2026-11-29T22:04:00Z"
    # the same second twice: a suffix, not an overwrite
    again = llm_gate.store_report({"timestamp": "2026-11-29T22:04:00Z", "passed": False}, str(d), keep=3)
    assert again.endswith("20261129T220400Z-1.json")
    assert sorted(os.listdir(d))[-2:] == ["20261129T220400Z.json", "latest.json"]
    assert not (d / "20261129T220200Z.json").exists()
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_store_report_keeps_the_reports_to_root_also_in_a_directory_an_older_deploy_opened(tmp_path):
    """Reports 0600 in a 0700 directory (issue 26): a 0755 directory left by an older deploy is closed."""
    d = tmp_path / "gate"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    path = llm_gate.store_report({"timestamp": "2026-12-02T10:00:00Z", "passed": True}, str(d), keep=3)
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert {os.stat(p).st_mode & 0o777 for p in (path, d / "latest.json")} == {0o600}
