#!/usr/bin/env python3
"""A stand-in for an engine upgrade that runs fewer requests at once than the target concurrency.

``capped-engine.py PORT UPSTREAM_PORT VENV_LINK CAPPED_VERSION``: in front of the real rehearsal
server (``transformers serve`` on ``UPSTREAM_PORT``), answers ``/server_info`` the way SGLang
0.5.17 does when it starts with ``max_running_requests`` capped by its mamba state cache
(bench/results/sglang-0.5.17-server-info.json): ``internal_states[0].effective_max_running_requests_per_dp``
is 1 while the venv that ``VENV_LINK`` points at holds transformers ``CAPPED_VERSION`` (the
upgrade's candidate), and 4 (what was asked) for any other version. Every other request goes to
the real server, streamed as it answers; SGLang's ``ignore_eos`` becomes the
``generation_config`` with ``min_new_tokens`` that transformers serve reads, so the gate's
measurement is the real server's.

transformers serve reports no running-request limit, and a real SGLang cannot run on this CPU:
this is the one thing of the upgrade that the rehearsal cannot produce on demand.
"""

from __future__ import annotations

import http.client
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ASKED = 4
CAPPED = 1
# Response headers that describe the upstream connection, not the body: this server answers
# HTTP/1.0 and ends the body by closing the connection.
HOP_HEADERS = {"connection", "content-length", "date", "keep-alive", "server", "transfer-encoding"}


def engine_version(venv_link: Path) -> str | None:
    """The transformers version installed in the venv that ``venv_link`` points at (None without one)."""
    for dist_info in venv_link.resolve().glob("lib/python3*/site-packages/transformers-*.dist-info"):
        return dist_info.name.removeprefix("transformers-").removesuffix(".dist-info")
    return None


def as_transformers_request(body: bytes) -> bytes:
    """A chat request with SGLang's ``ignore_eos`` asked the way transformers serve understands it."""
    payload = json.loads(body)
    if payload.pop("ignore_eos", False):
        tokens = payload.get("max_tokens") or payload.get("max_completion_tokens")
        payload["generation_config"] = json.dumps({"min_new_tokens": int(tokens)})
    return json.dumps(payload).encode()


class CappedEngine(BaseHTTPRequestHandler):
    """``/server_info`` answered here, everything else forwarded to the real server."""

    upstream_port = 0
    venv_link = Path("/")
    capped_version = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        """Server info here; anything else upstream."""
        if self.path.split("?")[0] in ("/server_info", "/get_server_info"):
            self._server_info()
        else:
            self._forward(None)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        """Forward the request, a chat completion translated for transformers serve."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/v1/chat/completions"):
            body = as_transformers_request(body)
        self._forward(body)

    def _server_info(self) -> None:
        version = engine_version(self.venv_link)
        running = CAPPED if version == self.capped_version else ASKED
        self._answer(
            200,
            {
                "version": version,
                "max_running_requests": ASKED,
                "internal_states": [{"effective_max_running_requests_per_dp": running}],
            },
        )
        sys.stderr.write(f"server_info: transformers {version}, effective_max_running_requests_per_dp {running}\n")

    def _forward(self, body: bytes | None) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "authorization", "content-type")}
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=600)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
        except OSError as exc:
            # The real server is (re)starting: answer as a server that is not ready yet.
            self._answer(503, {"error": f"upstream: {exc}"})
            return
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_HEADERS:
                self.send_header(name, value)
        self.end_headers()
        while chunk := answer.read1(65536):
            self.wfile.write(chunk)
            self.wfile.flush()
        upstream.close()

    def _answer(self, status: int, payload: dict[str, object]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: object) -> None:
        """Log the request line only (never a header's value)."""
        sys.stderr.write(fmt % args + "\n")


if __name__ == "__main__":
    port, upstream_port, venv_link, capped_version = sys.argv[1:5]
    CappedEngine.upstream_port = int(upstream_port)
    CappedEngine.venv_link = Path(venv_link)
    CappedEngine.capped_version = capped_version
    ThreadingHTTPServer(("127.0.0.1", int(port)), CappedEngine).serve_forever()
