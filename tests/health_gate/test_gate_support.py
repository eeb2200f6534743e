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
