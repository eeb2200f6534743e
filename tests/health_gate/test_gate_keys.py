"""Which keys the API key reads: the gate asks, on every deploy, and says so (issue 51, item 1).

SGLang 0.5.11 answers ``/server_info`` and ``/get_server_info`` with ``dataclasses.asdict`` of its
``ServerArgs``, ``api_key`` and ``admin_api_key`` included, at the level the API key unlocks
(``sglang/srt/entrypoints/http_server.py``, ``sglang/srt/utils/auth.py``): every client with the API
key reads the admin key. A real SGLang server cannot run on this machine, hence the fake server's
scripted answers, with the field names of SGLang 0.5.11's ServerArgs.
"""

from __future__ import annotations

import json
import os
import pwd
import ssl
from pathlib import Path
from typing import Any

import pytest
from fake_http import BackgroundServer, JSONHandler
from gate_fakes import base_options, llm_gate
from test_gate_cli import FAST, run_cli
from test_gate_module import run_module, short_gate
from tls_certs import CA, Issued

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


# The API front (docs/security.md): on a network bind SGLang listens on loopback (the gate's url) and a
# front on the public bind passes only the public API. The gate then asks the front (public_url), as a
# client would, and a front that hands the admin key over fails the gate.
PUBLIC_ROUTE = "/server_info (the admin key)"


class APIFront(BackgroundServer):
    """The public bind of a front: ``/server_info`` and ``/get_server_info`` answer 403, as a front that
    passes only the public API, except the routes in ``leaks``, which hand over SGLang's arguments as the
    engine behind it would; anything else 404. Records what it was asked and with which Authorization."""

    def __init__(self, leaks: tuple[str, ...] = (), tls: Issued | None = None, folder: Path | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        front = self

        class Handler(JSONHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                front.requests.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                if self.path == "/health":
                    self._json(200, {})
                elif self.path in leaks and self.headers.get("Authorization") == f"Bearer {API_KEY}":
                    self._json(200, sglang_arguments(API_KEY, ADMIN_KEY))
                elif self.path in ("/server_info", "/get_server_info"):
                    self._json(403, {"detail": "Forbidden"})
                else:
                    self._json(404, {"detail": "Not Found"})

        super().__init__(Handler)
        if tls is not None and folder is not None:  # TLS as the front serves it: its certificate and key
            paths = tls.write(folder)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(paths["cert"], paths["key"])
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.url = self.url.replace("http://", "https://")


@pytest.fixture
def api_front(tmp_path):
    """Factory: ``api_front(leaks=(...), tls=Issued)`` returns a started :class:`APIFront`."""
    fronts: list[APIFront] = []

    def make(leaks: tuple[str, ...] = (), tls: Issued | None = None) -> APIFront:
        fronts.append(APIFront(leaks, tls, tmp_path / f"front{len(fronts)}").start())
        return fronts[-1]

    yield make
    for front in fronts:
        front.close()


def public_failure(front_url: str, routes: str = "/server_info") -> str:
    """The reason the gate gives when the API front at ``front_url`` hands the admin key over at ``routes``."""
    return (
        f"the public URL {front_url} hands the admin key to the API key at {routes}: every client with the API "
        "key could use the engine's admin routes (/flush_cache, /update_weights_from_disk, ...); the API front "
        "must refuse /server_info and /get_server_info to clients (docs/security.md)"
    )


def test_an_admin_key_at_the_public_url_fails_the_gate_naming_the_route(fake_server, api_front):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front(leaks=("/server_info",))
    options = base_options(engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url)
    report = llm_gate.run_gate(options)
    assert report["passed"] is False and report["phase"] == "discover"
    assert report["keys_readable"] == [PUBLIC_ROUTE] and report["public_url"] == front.url
    assert report["reasons"] == [public_failure(front.url)]
    # Asked at the front with the client's key, as a client would.
    asked = [r for r in front.requests if r["path"] in ("/server_info", "/get_server_info")]
    assert [r["path"] for r in asked] == ["/server_info", "/get_server_info"]
    assert {r["authorization"] for r in asked} == {f"Bearer {API_KEY}"}
    assert engine.chat_requests() == []  # failed in discovery, before a request was measured
    assert ADMIN_KEY not in json.dumps(report) and API_KEY not in json.dumps(report)


def test_a_front_that_refuses_the_routes_passes_while_the_engine_behind_it_would_hand_the_key_over(
    fake_server, api_front
):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front()
    report = llm_gate.run_gate(base_options(engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url))
    assert report["passed"], report["reasons"]
    assert report["keys_readable"] == [] and report["public_url"] == front.url
    assert not any("reads the admin key" in note for note in report["notes"])
    assert [r["path"] for r in front.requests] == ["/health", "/server_info", "/get_server_info"]
    # The engine's own routes are not asked for keys (discovery reads /server_info, which answers, so
    # /get_server_info would only come from the keys check): the engine sits behind the front on loopback.
    assert "/get_server_info" not in [r["path"] for r in engine.requests]


def test_without_a_public_url_the_engine_is_asked_and_a_finding_stays_a_warning(fake_server):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    report = llm_gate.run_gate(base_options(engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY))
    assert report["public_url"] is None
    assert report["keys_readable"] == ROUTES and report["passed"], report["reasons"]
    assert "/get_server_info" in [r["path"] for r in engine.requests]


def test_a_public_url_without_an_admin_key_of_its_own_asks_only_that_it_answers(fake_server, api_front):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, None))
    front = api_front(leaks=("/server_info", "/get_server_info"))
    for admin in (None, API_KEY):
        options = base_options(engine.url, api_key=API_KEY, admin_api_key=admin, public_url=front.url)
        report = llm_gate.run_gate(options)
        assert report["keys_readable"] is None and report["passed"], report["reasons"]
    assert [r["path"] for r in front.requests] == ["/health", "/health"]


@pytest.mark.parametrize("bad", ["ftp://front:30000", "127.0.0.1:30000", "http://front:port", 30000])
def test_a_public_url_that_is_no_http_url_is_refused_naming_the_option(bad):
    with pytest.raises(llm_gate.GateUsageError, match=r"^public_url must be an http:// or https:// URL") as refused:
        llm_gate.GateConfig.from_options({"public_url": bad})
    assert "; " not in str(refused.value)  # one sentence, this option's
    assert llm_gate.GateConfig.from_options({"public_url": ""}).public_url == ""
    assert llm_gate.GateConfig.from_options({"public_url": "https://[::1]:443"}).public_url == "https://[::1]:443"


def test_a_public_listener_user_that_is_no_account_is_refused_before_any_request(fake_server, api_front):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front()
    options = base_options(
        engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url,
        public_listener_user="no-such-account",
    )  # fmt: skip
    with pytest.raises(llm_gate.GateUsageError, match="public_listener_user 'no-such-account' is not an account"):
        llm_gate.run_gate(options)
    with pytest.raises(llm_gate.GateUsageError, match="public_listener_user must be an account name or uid"):
        llm_gate.GateConfig.from_options({"public_listener_user": 7})
    assert engine.requests == [] and front.requests == []


def test_the_public_url_gets_no_key_from_a_listener_of_another_account(fake_server, api_front):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front(leaks=("/server_info",))
    other = "nobody" if pwd.getpwnam("nobody").pw_uid != os.getuid() else "root"
    options = base_options(
        engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url, public_listener_user=other
    )
    report = llm_gate.run_gate(options)
    assert report["passed"] is False and report["phase"] == "discover"
    assert report["reasons"][0].startswith(f"at the public URL {front.url}, port {front.port} of this host is held by")
    assert f"not by {other}" in report["reasons"][0]
    assert front.requests == []  # the guard refused before a byte was sent


def test_the_cli_fails_on_a_leaking_public_url_without_printing_a_key(fake_server, api_front, tmp_path):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front(leaks=("/server_info", "/get_server_info"))
    admin_file = tmp_path / "admin"
    admin_file.write_text(ADMIN_KEY + "\n")
    # The front is this test's process: the guard of the public URL lets the gate talk to its account.
    me = pwd.getpwuid(os.getuid()).pw_name
    common = ["--url", engine.url, "--public-url", front.url, "--public-listener-user", me, *FAST]
    env = {"HEALTH_GATE_API_KEY": API_KEY}
    proc = run_cli(*common, "--admin-api-key-file", str(admin_file), "--json", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["reasons"] == [public_failure(front.url, "/server_info and /get_server_info")]
    text = run_cli(*common, "--admin-api-key-file", str(admin_file), env=env)
    assert text.returncode == 1 and "the API front must refuse" in text.stdout
    for out in (proc, text):
        assert ADMIN_KEY not in out.stdout + out.stderr and API_KEY not in out.stdout + out.stderr
    bad = run_cli("--url", engine.url, "--public-url", "front:30000", *FAST, "--json", env=env)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"].startswith("public_url must be")


def test_the_module_fails_on_a_leaking_public_url_and_quotes_no_key(fake_server, api_front, tmp_path):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front = api_front(leaks=("/server_info",))
    args = short_gate(
        engine, tmp_path, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url, public_listener_user=""
    )
    out = run_module(args)
    assert out.get("failed") is True and out["report"]["phase"] == "discover"
    assert out["report"]["reasons"] == [public_failure(front.url)]
    # A verdict, not a warning besides it.
    assert not any("reads the admin key" in warning for warning in out.get("warnings", []))
    assert ADMIN_KEY not in json.dumps(out) and API_KEY not in json.dumps(out)


# TLS on the front (issue 51, item 2; docs/security.md, "TLS"): the gate asks the public bind as a client, the
# certificate verified with the CA the front's was issued by (ca_file) for the server name clients ask for.
def tls_front(api_front, tmp_path, names=("gpu1", "127.0.0.1")) -> tuple[APIFront, str]:
    """A front serving TLS with a certificate of a test CA for ``names``; (front, the CA's file)."""
    ca = CA()
    (tmp_path / "ca.pem").write_text(ca.pem)
    return api_front(tls=ca.issue(*names)), str(tmp_path / "ca.pem")


def test_a_tls_front_is_asked_with_its_certificate_verified(fake_server, api_front, tmp_path):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front, ca_file = tls_front(api_front, tmp_path)
    assert front.url.startswith("https://127.0.0.1:")
    options = base_options(engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url)
    report = llm_gate.run_gate(dict(options, ca_file=ca_file, tls_server_name="gpu1"))
    assert report["passed"], report["reasons"]
    assert report["tls"] == {"ca_file": ca_file, "server_name": "gpu1"}
    assert [r["path"] for r in front.requests] == ["/health", "/server_info", "/get_server_info"]


@pytest.mark.parametrize("wrong", ["another CA", "another name", "the system CAs"])
def test_a_certificate_clients_would_refuse_fails_the_gate_before_a_key_is_sent(
    fake_server, api_front, tmp_path, wrong
):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, ADMIN_KEY))
    front, ca_file = tls_front(api_front, tmp_path)
    if wrong == "another CA":
        (tmp_path / "other.pem").write_text(CA("other").pem)
        ca_file = str(tmp_path / "other.pem")
    settings = {"ca_file": "" if wrong == "the system CAs" else ca_file,
                "tls_server_name": "gpu2" if wrong == "another name" else "gpu1"}  # fmt: skip
    options = base_options(engine.url, api_key=API_KEY, admin_api_key=ADMIN_KEY, public_url=front.url)
    report = llm_gate.run_gate(dict(options, **settings))
    assert report["passed"] is False and report["phase"] == "discover"
    reason = report["reasons"][0]
    assert reason.startswith(f"the public URL {front.url} presents a certificate that clients refuse: "), reason
    assert "Hostname mismatch" in reason if wrong == "another name" else "unable to get local issuer" in reason
    assert front.requests == []  # no request, so no key, went to a server the gate does not trust
    assert engine.chat_requests() == []


def test_a_front_that_does_not_answer_fails_the_gate(fake_server, api_front):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, None))
    front = api_front()
    front.close()
    report = llm_gate.run_gate(base_options(engine.url, api_key=API_KEY, public_url=front.url))
    assert report["passed"] is False and report["phase"] == "discover"
    assert report["reasons"][0].startswith(f"the public URL {front.url} does not answer /health ("), report["reasons"]


def test_a_ca_file_the_gate_cannot_read_is_refused_before_any_request(fake_server, api_front, tmp_path):
    engine = fake_server(api_key=API_KEY, server_info=sglang_arguments(API_KEY, None))
    front, _ = tls_front(api_front, tmp_path)
    options = dict(base_options(engine.url, api_key=API_KEY, public_url=front.url), ca_file=str(tmp_path / "none.pem"))
    with pytest.raises(llm_gate.GateUsageError, match=r"^ca_file '.*none.pem' cannot be read as PEM certificates"):
        llm_gate.run_gate(options)
    assert engine.requests == [] and front.requests == []
