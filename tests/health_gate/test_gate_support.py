"""The gate's fakes (tests/shared/gate_fakes.py): a sanity check of the fake server, which the
other ``test_gate_*`` modules (and the API key's tests) rely on."""

from __future__ import annotations

from gate_fakes import llm_gate


def test_fake_server_streams_usage_and_done(fake_server):
    """The fake speaks the SSE dialect the gate expects (guards the other tests' premise)."""
    server = fake_server()
    endpoint = llm_gate.Endpoint(server.url)
    res = llm_gate.stream_chat(endpoint, "fake-model", llm_gate.FALLBACK_PROMPTS[0], 16, 5)
    assert res.completion_tokens == 11
    assert res.content_chunks == 11
    assert res.finish_reason == "length"


def test_decode_runs_to_the_finish_even_when_the_last_tokens_carry_no_text(fake_server):
    """Tokens past the last content chunk (a trained tiny model's empty text after its answer, with ignore_eos)
    are decoded until the finish chunk: the decode time ends there. Ending it at the last content chunk read
    256 tokens in 0.005 s as 50,000 tokens/s on real SGLang (bench/results/gpu_acceptance_1xh100_trained.md)."""
    chat = {"mode": "ok", "chunks": 2, "tokens_per_chunk": 1, "ttft": 0.05, "gap": 0.01, "silent_tokens": 98,
            "silent_s": 0.5}  # fmt: skip
    server = fake_server(chat=chat)
    res = llm_gate.stream_chat(llm_gate.Endpoint(server.url), "fake-model", llm_gate.FALLBACK_PROMPTS[0], 100, 5)
    assert (res.completion_tokens, res.content_chunks) == (100, 2)
    assert 0.5 <= res.decode_s < 1.5
    assert 60 < res.decode_tps < 99 / 0.5
