"""Which keys the API key reads: the gate asks, on every deploy, and says so (issue 51, item 1).

SGLang 0.5.11 answers ``/server_info`` and ``/get_server_info`` with ``dataclasses.asdict`` of its
``ServerArgs``, ``api_key`` and ``admin_api_key`` included, at the level the API key unlocks
(``sglang/srt/entrypoints/http_server.py``, ``sglang/srt/utils/auth.py``): every client with the API
key reads the admin key. A real SGLang server cannot run on this machine, hence the fake server's
scripted answers, with the field names of SGLang 0.5.11's ServerArgs.
"""

from __future__ import annotations

import json
from typing import Any

from gate_fakes import base_options, llm_gate
from test_gate_module import run_module, short_gate

API_KEY = "sk-client-4411"
ADMIN_KEY = "sk-admin-9090"
ROUTES = ["/server_info (the admin key)", "/get_server_info (the admin key)"]


def sglang_arguments(api_key: str | None, admin_api_key: str | None) -> dict[str, Any]:
    """What SGLang 0.5.11's /server_info holds of its arguments (the keys among them), as it sends them."""
    return {
        "version": "0.5.11",
        "model_path": "/srv/models/qwen3.6-27b/current",
        "api_key": api_key,
        "admin_api_key": admin_api_key,
        "internal_states": [{}],
    }


def test_an_admin_key_in_server_info_is_found_and_said_without_quoting_it(fake_server):
    server = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    report = llm_gate.run_gate(base_options(server.url, api_key=API_KEY, admin_api_key=ADMIN_KEY))
    assert report["keys_readable"] == ROUTES
    assert llm_gate.keys_readable_note(ROUTES) in report["notes"]
    # Asked with the client's key, not the admin key: that is what a client holds.
    asked = [r for r in server.requests if r["path"] in ("/server_info", "/get_server_info")]
    assert {r["headers"]["Authorization"] for r in asked} == {f"Bearer {API_KEY}"}
    assert ADMIN_KEY not in json.dumps(report) and API_KEY not in json.dumps(report)
    # A finding, not a verdict (until a front hides the routes: docs/security.md).
    assert report["passed"], report["reasons"]


def test_routes_that_refuse_the_api_key_or_hold_no_admin_key_are_not_findings(fake_server):
    refused = fake_server(api_key=API_KEY, server_info=None)  # 404, as a front that passes only the public API
    report = llm_gate.run_gate(base_options(refused.url, api_key=API_KEY, admin_api_key=ADMIN_KEY))
    assert report["keys_readable"] == [] and not any("reads the admin key" in n for n in report["notes"])
    masked = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, None))
    report = llm_gate.run_gate(base_options(masked.url, api_key=API_KEY, admin_api_key=ADMIN_KEY))
    assert report["keys_readable"] == []


def test_without_an_admin_key_of_its_own_nothing_is_asked(fake_server):
    server = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, None))
    for admin in (None, API_KEY):
        report = llm_gate.run_gate(base_options(server.url, api_key=API_KEY, admin_api_key=admin))
        assert report["keys_readable"] is None


def test_the_module_warns_with_the_routes(fake_server, tmp_path):
    server = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    out = run_module(short_gate(server, tmp_path, api_key=API_KEY, admin_api_key=ADMIN_KEY))
    assert out.get("failed") is not True, out.get("msg")
    assert out["report"]["keys_readable"] == ROUTES
    assert out["warnings"] == ["health_gate: " + llm_gate.keys_readable_note(ROUTES)]
    assert ADMIN_KEY not in json.dumps(out)
