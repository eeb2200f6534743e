"""The API front (issue 51, item 1; docs/security.md, "The API front").

SGLang 0.5.11 answers ``/server_info`` and ``/get_server_info`` with its arguments, the admin key among
them, to every holder of the API key. On a network bind the role now puts Debian's nginx on the bind and
the engine on loopback behind it. These tests render the role's own front.conf.j2 and front.service.j2
with its defaults and vars (ansible-playbook) and run them in the test hosts' Debian 12 base image (make
image: it carries Debian's nginx and systemd 252): ``nginx -t`` accepts the configuration for every kind
of bind; a real nginx in front of a small engine stand-in passes the public routes, gives the gateway
routes only to the gateway sources, refuses /get_server_info to everyone and everything else with a 404,
normalised paths included; ``systemd-analyze security`` rates the front's unit under the threshold. The
engine stand-in answers every path with the path it was asked (what the engine receives is what counts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_drain import template_run
from tls_certs import CA, Issued

IMAGE = os.environ.get("BASE_IMAGE", "local/bookworm-systemd")
# The threshold of every unit the role writes (molecule/default's test_sandbox.py for the engine's).
MAX_EXPOSURE = 2.0
PUBLIC = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"]
GATEWAY = ["/server_info", "/model_info", "/get_model_info", "/v1/loads", "/health_generate"]
# The stand-in engine: every GET and POST is answered 200 with the path it received.
ENGINE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        body = self.path.encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 30001), H).serve_forever()
"""
# Inside the container: the engine stand-in, nginx with the rendered configuration as an unprivileged
# account, then one curl per path (status and body), printed as JSON lines.
ASK = """
python3 -c "$ENGINE" &
mkdir -p /tmp/front /etc/inference-server-front/tls && cp /front/conf /tmp/front/conf && chown -R nobody /tmp/front
if [ -d /front/tls ]; then cp /front/tls/cert.pem /front/tls/key.pem /etc/inference-server-front/tls/; fi
chown -R nobody /etc/inference-server-front/tls
su -s /bin/sh nobody -c 'nginx -e stderr -c /tmp/front/conf -p /tmp/front/ -g "daemon off;"' &
for i in $(seq 100); do curl -sf $CURL_OPTS -o /dev/null "$BASE/health" && break; sleep 0.1; done
for path in $PATHS; do
  out=$(curl -s $CURL_OPTS -w '\\n%{http_code}' "$BASE$path")
  status=$(echo "$out" | tail -1) body=$(echo "$out" | head -1 | tr -d '"<>\\r')
  printf '{"path": "%s", "status": "%s", "body": "%s"}\\n' "$path" "$status" "$body"
done
"""


def render(tmp_path: Path, template: str, **variables) -> str:
    """The role's ``template`` rendered with its defaults and vars and ``variables``."""
    proc = template_run(tmp_path, template=template, **variables)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (tmp_path / "unit").read_text()


def in_image(tmp_path: Path, script: str, *docker_args: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` run by sh in the base image, with ``tmp_path`` mounted read-only at /front."""
    args = [*docker_args, *(arg for name, value in env.items() for arg in ("-e", f"{name}={value}"))]
    return subprocess.run(
        ["docker", "run", "--rm", "--network=none", "-v", f"{tmp_path}:/front:ro", *args, IMAGE, "sh", "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.4.17", "fd00::5"])
def test_nginx_accepts_the_configuration_for_every_kind_of_bind(tmp_path, bind):
    conf = render(tmp_path, "front.conf.j2", inference_server_host=bind, inference_server_port=30000)
    (tmp_path / "conf").write_text(conf)
    assert "ssl_certificate /etc/inference-server-front/tls/cert.pem;" in conf  # TLS by default
    CA().issue("gpu1").write(tmp_path)
    # nginx -t asks whether a specific address is this host's: the container gets the two of BINDS; and it
    # reads the certificate and key the configuration names.
    script = (
        "ip addr add 10.0.4.17/32 dev lo && ip -6 addr add fd00::5/128 dev lo && mkdir -p /tmp/p "
        "/etc/inference-server-front/tls && cp /front/cert.pem /front/key.pem /etc/inference-server-front/tls/"
    )
    check = f"{script} && nginx -t -q -e stderr -c /front/conf -p /tmp/p/"
    proc = in_image(tmp_path, check, "--cap-add=NET_ADMIN", "--sysctl=net.ipv6.conf.all.disable_ipv6=0")
    assert proc.returncode == 0, proc.stderr + conf
    engine = "[::1]:30001" if ":" in bind else "127.0.0.1:30001"
    assert f"server {engine};" in conf


def test_the_gateway_sources_are_the_unit_allow_lists_peers_and_the_trusted_sources(tmp_path):
    """One derivation of this host's and the gateways' addresses (as the precheck resolved them) feeds the
    front's gateway sources and the unit's IPAddressAllow=; the trusted sources are the front's alone."""
    variables = {
        "inference_server_host": "0.0.0.0",
        "inference_server_front_trusted_sources": ["10.1.0.0/16"],
        "_inference_server_peer_addresses": ["10.0.0.9", "fd00::9"],
    }
    conf = render(tmp_path, "front.conf.j2", **variables)
    assert re.findall(r"^\s+(\S+) 1;$", conf, re.M) == ["127.0.0.0/8", "::1", "10.0.0.9", "fd00::9", "10.1.0.0/16"]
    unit = render(tmp_path, "inference-server.service.j2", **variables)
    assert re.findall(r"^IPAddressAllow=(.*)$", unit, re.M) == ["localhost 10.0.0.9 fd00::9"]


def ask(
    tmp_path: Path, paths: list[str], tls: Issued | None = None, curl: str = "", base: str = "", **variables
) -> dict[str, tuple[int, str]]:
    """What a client on the host gets through the front for each path: (status, the engine's path). Without
    ``tls`` the front serves plain HTTP (inference_server_tls false); with it, its certificate and key, and
    ``curl``'s options (--cacert, --resolve) ask it as a client that verifies it would."""
    variables.setdefault("inference_server_tls", tls is not None)
    conf = render(tmp_path, "front.conf.j2", inference_server_host="0.0.0.0", inference_server_port=30000, **variables)
    (tmp_path / "conf").write_text(conf)
    if tls is not None:
        tls.write(tmp_path / "tls")
    base = base or ("https://gpu1:30000" if tls is not None else "http://127.0.0.1:30000")
    proc = in_image(tmp_path, ASK, ENGINE=ENGINE, PATHS=" ".join(paths), BASE=base, CURL_OPTS=curl)
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(paths), proc.stdout + proc.stderr
    assert "000" not in [a["status"] for a in answers], proc.stdout + proc.stderr
    return {a["path"]: (int(a["status"]), a["body"] if a["status"] == "200" else "") for a in answers}


def test_a_client_reaches_the_public_api_and_nothing_else(tmp_path):
    """A source that is no gateway (the client's loopback is not among them here)."""
    internal = ["/get_server_info", "/flush_cache", "/update_weights_from_disk", "/docs", "/generate", "/"]
    tricks = ["/v1/models/../server_info", "//server_info", "/v1/models/%2e%2e/server_info", "/server_info/"]
    paths = PUBLIC + ["/v1/models/m1"] + GATEWAY + internal + tricks
    got = ask(tmp_path, paths, _inference_server_front_gateway_sources=["10.9.9.9"])
    assert {p: got[p] for p in PUBLIC} == {p: (200, p) for p in PUBLIC}
    assert got["/v1/models/m1"] == (200, "/v1/models/m1")
    assert {p: got[p][0] for p in GATEWAY} == dict.fromkeys(GATEWAY, 403)
    assert got["/get_server_info"][0] == 403
    assert {p: got[p][0] for p in internal[1:]} == dict.fromkeys(internal[1:], 404)
    # nginx matches the normalised path: none of these reaches the engine's /server_info.
    assert all(got[p][0] in (403, 404) for p in tricks), got


def test_a_gateway_source_reads_the_gateway_routes_but_never_get_server_info(tmp_path):
    got = ask(tmp_path, GATEWAY + ["/get_server_info"])  # loopback is a gateway source by default
    assert {p: got[p] for p in GATEWAY} == {p: (200, p) for p in GATEWAY}
    assert got["/get_server_info"][0] == 403


def test_the_front_serves_tls_that_a_client_verifies_and_no_plain_http(tmp_path):
    """issue 51, item 2: the API key crosses the network inside TLS; a client that verifies the certificate
    with the CA it was issued by, for the host's name, reaches the API; plain HTTP on that port does not."""
    ca = CA()
    (tmp_path / "ca.pem").write_text(ca.pem)
    verify = "--cacert /front/ca.pem --resolve gpu1:30000:127.0.0.1"
    got = ask(tmp_path, ["/health", "/v1/models", "/flush_cache"], tls=ca.issue("gpu1", "127.0.0.1"), curl=verify)
    assert got == {"/health": (200, "/health"), "/v1/models": (200, "/v1/models"), "/flush_cache": (404, "")}
    # Plain HTTP on the TLS port: nginx's 400, no route reached.
    plain = ask(tmp_path, ["/health", "/v1/models"], tls=ca.issue("gpu1"), base="http://127.0.0.1:30000")
    assert plain == {"/health": (400, ""), "/v1/models": (400, "")}
    # Another CA, or a name the certificate does not hold: curl refuses before a request goes out (000).
    other = tmp_path / "other"
    other.mkdir()
    (other / "ca.pem").write_text(CA("other").pem)
    with pytest.raises(AssertionError, match="000"):
        ask(other, ["/health"], tls=ca.issue("gpu1"), curl=verify)


def test_the_fronts_unit_is_sandboxed_under_the_threshold(tmp_path):
    unit = render(tmp_path, "front.service.j2", inference_server_host="0.0.0.0", inference_server_port=30000)
    assert re.search(r"^User=inference-front$", unit, re.M), unit
    root = tmp_path / "root" / "etc" / "systemd" / "system"
    root.mkdir(parents=True)
    (root / "inference-server-front.service").write_text(unit)
    proc = in_image(
        tmp_path,
        "systemd-analyze security --offline=true --root=/front/root --no-pager inference-server-front.service",
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, proc.stdout
