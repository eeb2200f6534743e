"""The gate against scripted local HTTP servers: measurement, SGLang details, failure modes."""

from __future__ import annotations

import json

import pytest
from gate_fakes import (
    FakeLLMServer,
    base_options,
    free_port,
    later,
    llm_gate,
    timed,
)


def test_decode_speed_and_ttft_match_what_the_server_paced(fake_server):
    # 21 single-token chunks, the first after 0.2 s, then one every 20 ms: 20 tokens / 0.4 s = 50 tok/s.
    server = fake_server(chat={"mode": "ok", "chunks": 21, "tokens_per_chunk": 1, "ttft": 0.2, "gap": 0.02})
    report = llm_gate.run_gate(base_options(server.url, requests=3, min_decode_tps=10, max_ttft_s=2))
    assert report["passed"], report["reasons"]
    agg = report["aggregate"]
    assert agg["decode_tps_mean"] == pytest.approx(50, rel=0.25)
    assert agg["ttft_p50_s"] == pytest.approx(0.2, abs=0.1)
    assert agg["itl_mean_s"] == pytest.approx(0.02, abs=0.01)
    assert agg["completion_tokens"] == 63
    assert [r["completion_tokens"] for r in report["requests"]] == [21, 21, 21]
    assert report["model"] == "fake-model"
    assert report["engine"] == "generic"
    assert report["summary"].startswith("gate PASS: ")


def test_tokens_come_from_usage_not_from_chunk_counts(fake_server):
    # MTP-like: 3 tokens per chunk, 11 chunks 50 ms apart -> usage says 33 tokens:
    # (33 - 1) / 0.5 s = 64 tok/s. Counting chunks would give 10 / 0.5 = 20.
    server = fake_server(chat={"mode": "ok", "chunks": 11, "tokens_per_chunk": 3, "ttft": 0.05, "gap": 0.05})
    report = llm_gate.run_gate(base_options(server.url, requests=2))
    assert report["passed"], report["reasons"]
    assert report["aggregate"]["decode_tps_mean"] == pytest.approx(64, rel=0.25)
    assert report["aggregate"]["tokens_per_chunk"] == pytest.approx(3.0)


def test_requests_are_streaming_greedy_fixed_length_and_ask_for_usage(fake_server):
    server = fake_server()
    report = llm_gate.run_gate(
        base_options(
            server.url,
            warmup_requests=2,
            requests=3,
            max_tokens=77,
            api_key="sk-test-key",
            prompts=["alpha prompt", "beta prompt"],
        )
    )
    assert report["passed"], report["reasons"]
    chats = server.chat_requests()
    assert len(chats) == 5  # 2 warm-up + 3 measured
    for req in chats:
        body = req["body"]
        assert body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 77
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == "fake-model"
        assert req["headers"]["Authorization"] == "Bearer sk-test-key"
    # prompts are used round-robin; the measured requests start again at the first, as the warm-up did
    contents = [r["body"]["messages"][0]["content"] for r in chats]
    assert contents == ["alpha prompt", "beta prompt", "alpha prompt", "beta prompt", "alpha prompt"]
    assert [r["prompt_id"] for r in report["requests"]] == ["prompt-0", "prompt-1", "prompt-0"]
    assert "sk-test-key" not in json.dumps(report)


def test_concurrency_runs_requests_in_parallel(fake_server):
    server = fake_server(chat={"mode": "ok", "chunks": 11, "ttft": 0.3, "gap": 0.02})
    serial = llm_gate.run_gate(base_options(server.url, warmup_requests=0, requests=4, concurrency=1))
    parallel = llm_gate.run_gate(base_options(server.url, warmup_requests=0, requests=4, concurrency=4))
    assert serial["passed"] and parallel["passed"]
    # four 0.5 s requests: about 2 s one by one, about 0.5 s together
    assert parallel["aggregate"]["wall_s"] < serial["aggregate"]["wall_s"] / 2
    assert parallel["aggregate"]["total_tps"] > 2 * serial["aggregate"]["total_tps"]


def test_sglang_version_and_accept_length_from_server_info(fake_server):
    info = {
        "version": "0.5.11",
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "tp_size": 2,
        "api_key": "sk-leak",
        "model_path": "/root/models/Qwen3.6-27B",
        "internal_states": [{"avg_spec_accept_length": 2.31, "last_gen_throughput": 55.0}],
    }
    server = fake_server(server_info=info, models=["/root/models/Qwen3.6-27B"])
    report = llm_gate.run_gate(base_options(server.url, min_accept_length=1.5, api_key="sk-leak"))
    assert report["passed"], report["reasons"]
    assert report["engine"] == "sglang" and report["version"] == "0.5.11"
    assert report["speculative"]["accept_length"] == pytest.approx(2.31)
    assert report["speculative"]["source"].startswith("server_info")
    assert report["server"]["speculative_algorithm"] == "EAGLE"
    assert "accept 2.31 (min 1.5)" in report["summary"]
    assert "sk-leak" not in json.dumps(report)


def test_the_report_names_the_mamba_strategy_under_both_of_sglangs_names(fake_server):
    """SGLang 0.5.17 renamed mamba_scheduler_strategy to mamba_radix_cache_strategy and reports the old name as
    null (measured on one H100: bench/results/correctness_trained_gpu.md); the report keeps both."""
    info = {"version": "0.5.17", "mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}
    report = llm_gate.run_gate(base_options(fake_server(server_info=info).url))
    assert report["server"]["mamba_radix_cache_strategy"] == "extra_buffer"
    assert report["server"]["mamba_scheduler_strategy"] is None


def test_low_accept_length_fails_the_gate(fake_server):
    info = {
        "version": "0.5.11",
        "speculative_algorithm": "EAGLE",
        "internal_states": [{"avg_spec_accept_length": 1.016}],
    }
    server = fake_server(server_info=info)
    report = llm_gate.run_gate(base_options(server.url, min_accept_length=1.5))
    assert not report["passed"]
    assert report["reasons"] == ["MTP accept length 1.02 is below min_accept_length 1.5"]


def test_accept_length_falls_back_to_generate_meta_info(fake_server):
    info = {"version": "0.5.11", "speculative_algorithm": "EAGLE", "internal_states": [{}]}
    server = fake_server(server_info=info, generate_meta={"spec_accept_length": 2.05, "completion_tokens": 16})
    report = llm_gate.run_gate(base_options(server.url, min_accept_length=1.5))
    assert report["passed"], report["reasons"]
    assert report["speculative"]["accept_length"] == pytest.approx(2.05)
    assert report["speculative"]["source"].startswith("/generate")
    gen = [r for r in server.requests if r["path"] == "/generate"][0]["body"]
    assert gen["sampling_params"]["temperature"] == 0


def test_spec_off_means_no_accept_check(fake_server):
    server = fake_server(server_info={"version": "0.5.11", "speculative_algorithm": None, "internal_states": [{}]})
    report = llm_gate.run_gate(base_options(server.url, min_accept_length=1.5))
    assert report["passed"], report["reasons"]
    assert report["speculative"]["accept_length"] is None
    assert report["speculative"]["detail"]["note"] == "speculative decoding is off"


def test_503_forever_fails_at_the_deadline_saying_warming_up(fake_server):
    server = fake_server(health=503)
    report, took = timed(llm_gate.run_gate, base_options(server.url, ready_timeout_s=2.0))
    assert not report["passed"]
    assert report["phase"] == "warming"
    reason = report["reasons"][0]
    assert "not ready after 2 s" in reason
    assert "warming up (HTTP 503 from /health) for 2 s" in reason
    assert 1.9 <= took < 6
    assert server.chat_requests() == []


def test_connection_refused_is_still_loading_until_the_deadline():
    port = free_port()
    report = llm_gate.run_gate(base_options(f"http://127.0.0.1:{port:d}", ready_timeout_s=1.5))
    assert not report["passed"] and report["phase"] == "loading"
    assert "still loading (connection refused) for" in report["reasons"][0]


def test_loading_then_warming_then_ready_is_followed_through():
    port = free_port()
    states = iter([503, 503, 503])
    holder = {}

    def start():
        holder["server"] = FakeLLMServer(port=port, health=lambda: next(states, 200)).start()

    later(1.0, start)
    try:
        report = llm_gate.run_gate(base_options(f"http://127.0.0.1:{port:d}", ready_timeout_s=20))
    finally:
        holder["server"].close()
    assert report["passed"], report["reasons"]
    seen = [p["state"] for p in report["readiness"]["phases"]]
    assert seen == ["loading", "warming", "ready"]
    assert report["readiness"]["ready_after_s"] >= 1.0


def test_a_stalled_stream_fails_after_the_request_timeout(fake_server):
    server = fake_server(chat={"mode": "stall", "chunks": 11, "stall_after": 2, "stall_s": 30})
    report, took = timed(llm_gate.run_gate, base_options(server.url, request_timeout_s=1.0))
    assert not report["passed"]
    assert report["phase"] == "warmup"
    assert "stalled: no data for 1 s" in report["reasons"][0]
    assert "after 2 content chunks" in report["reasons"][0]
    assert took < 5


def test_a_dropped_stream_is_reported_as_dropped(fake_server):
    server = fake_server(chat={"mode": "drop", "chunks": 11, "drop_after": 3})
    report = llm_gate.run_gate(base_options(server.url, warmup_requests=0))
    assert not report["passed"] and report["phase"] == "measure"
    assert "stream dropped after 3 content chunks" in report["reasons"][0]


def test_a_stream_without_done_or_finish_is_dropped(fake_server):
    server = fake_server(chat={"mode": "no_usage", "chunks": 5, "done": False})
    # no_usage sends a finish_reason: then the missing usage is what fails
    report = llm_gate.run_gate(base_options(server.url, warmup_requests=0))
    assert "no usage.completion_tokens" in report["reasons"][0]
    assert "never from chunks" in report["reasons"][0]


def test_http_errors_quote_the_body(fake_server):
    body = json.dumps({"object": "error", "message": "The model `x` does not exist.", "code": 404})
    server = fake_server(chat={"mode": "http_error", "status": 404, "body": body})
    report = llm_gate.run_gate(base_options(server.url))
    assert not report["passed"]
    assert "HTTP 404" in report["reasons"][0]
    assert "The model `x` does not exist." in report["reasons"][0]


def test_an_error_event_inside_the_stream_fails_with_its_message(fake_server):
    server = fake_server(chat={"mode": "stream_error", "chunks": 11})
    report = llm_gate.run_gate(base_options(server.url, warmup_requests=0))
    assert "reported an error in the stream" in report["reasons"][0]
    assert "scheduler died" in report["reasons"][0]


def test_no_listed_model_and_no_model_option_fails_clearly(fake_server):
    server = fake_server(models=[])
    report = llm_gate.run_gate(base_options(server.url))
    assert not report["passed"] and report["phase"] == "discover"
    assert "set the model option" in report["reasons"][0]
    assert server.chat_requests() == []


def test_explicit_model_is_used_when_the_server_lists_none(fake_server):
    server = fake_server(models=[])
    report = llm_gate.run_gate(base_options(server.url, model="/srv/models/tiny/current"))
    assert report["passed"], report["reasons"]
    assert {r["body"]["model"] for r in server.chat_requests()} == {"/srv/models/tiny/current"}


def test_listed_model_wins_over_an_unlisted_option_with_a_note(fake_server):
    server = fake_server(models=["served-name"])
    report = llm_gate.run_gate(base_options(server.url, model="/srv/models/other"))
    assert report["model"] == "served-name"
    assert any("not listed" in n for n in report["notes"])
