#!/usr/bin/env python3
"""A stand-in in front of the real rehearsal server that adds one fault when its trigger holds.

    faulty-engine.py PORT UPSTREAM_PORT FAULT --when-venv VENV_LINK VERSION
    faulty-engine.py PORT UPSTREAM_PORT FAULT --when-unit UNIT_FILE MARKER

Every request goes to the real server (``transformers serve`` on ``UPSTREAM_PORT``) and its answer
back, streamed as it comes; SGLang's ``ignore_eos`` becomes the ``generation_config`` with
``min_new_tokens`` that transformers serve reads, so the gate's measurement is the real server's.
The trigger is read at each request: the venv that ``VENV_LINK`` points at holds transformers
``VERSION`` (an engine upgrade's candidate), or ``UNIT_FILE`` contains ``MARKER`` (a deploy that set
it, e.g. in inference_server_environment); so a rollback, which restores the venv or the unit,
ends the fault. ``FAULT``, each a thing a real server does that this CPU's cannot do on demand:

* ``cap``: ``/server_info`` answers as SGLang 0.5.17 does when its mamba state cache caps the
  running requests (bench/results/sglang-0.5.17-server-info.json): ``internal_states[0].
  effective_max_running_requests_per_dp`` 1 when triggered, 4 (what was asked) otherwise.
* ``corrupt``: the text of ``/v1/completions`` answers comes back with every character shifted
  (digits by one, letters by one): as fast as the real one, other tokens. Chat answers (the eval)
  pass untouched, so only the golden outputs can tell.
* ``sample``: completions and chat requests are sent to the real server with sampling on
  (temperature 1, no top-k): greedy decoding that is not deterministic, as batch-variant kernels
  or a broken cache make it.

Standard library only; it runs inside the test container with its python3.
"""

from __future__ import annotations

import argparse
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
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}


def engine_version(venv_link: Path) -> str | None:
    """The transformers version installed in the venv that ``venv_link`` points at (None without one)."""
    for dist_info in venv_link.resolve().glob("lib/python3*/site-packages/transformers-*.dist-info"):
        return dist_info.name.removeprefix("transformers-").removesuffix(".dist-info")
    return None


def shifted(text: str) -> str:
    """``text`` with each digit and letter moved one on (9 -> 0, z -> a): the same length, other tokens."""
    out = []
    for ch in text:
        if ch.isdigit():
            out.append(str((int(ch) + 1) % 10))
        elif "a" <= ch <= "z" or "A" <= ch <= "Z":
            base = ord("a") if ch.islower() else ord("A")
            out.append(chr(base + (ord(ch) - base + 1) % 26))
        else:
            out.append(ch)
    return "".join(out)


def for_transformers(payload: dict, sample: bool) -> dict:
    """A request as transformers serve takes it: SGLang's ``ignore_eos`` as ``min_new_tokens``; with
    ``sample``, greedy decoding turned into sampling."""
    config = json.loads(payload.get("generation_config") or "{}")
    if payload.pop("ignore_eos", False):
        config["min_new_tokens"] = int(payload.get("max_tokens") or payload.get("max_completion_tokens"))
    if sample:
        config.update(SAMPLING)
        payload["temperature"] = 1.0
    if config:
        payload["generation_config"] = json.dumps(config)
    return payload


class FaultyEngine(BaseHTTPRequestHandler):
    """Forwards everything to the real server; adds ``fault`` while ``triggered()``."""

    upstream_port = 0
    fault = "cap"
    trigger: tuple[str, str, str] = ("venv", "/", "")

    def triggered(self) -> bool:
        """Whether the fault is on for this request (the venv's version, or the unit's marker)."""
        kind, path, value = self.trigger
        if kind == "venv":
            return engine_version(Path(path)) == value
        try:
            return value in Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        """Server info here (the cap fault); anything else upstream."""
        if self.fault == "cap" and self.path.split("?")[0] in ("/server_info", "/get_server_info"):
            self._server_info()
        else:
            self._forward(None)

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        """Forward the request, translated for transformers serve; corrupt or sample when triggered."""
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._forward(body)
            return
        on = self.triggered()
        payload = for_transformers(json.loads(body or b"{}"), sample=on and self.fault == "sample")
        body = json.dumps(payload).encode()
        if on and self.fault == "corrupt" and path == "/v1/completions" and not payload.get("stream"):
            self._forward(body, corrupt=True)
        else:
            self._forward(body)

    def _server_info(self) -> None:
        version = engine_version(Path(self.trigger[1])) if self.trigger[0] == "venv" else None
        running = CAPPED if self.triggered() else ASKED
        self._answer(
            200,
            {
                "version": version,
                "max_running_requests": ASKED,
                "internal_states": [{"effective_max_running_requests_per_dp": running}],
            },
        )
        sys.stderr.write(f"server_info: transformers {version}, effective_max_running_requests_per_dp {running}\n")

    def _forward(self, body: bytes | None, corrupt: bool = False) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "authorization", "content-type")}
        upstream = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=600)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
        except OSError as exc:
            # The real server is (re)starting: answer as a server that is not ready yet.
            self._answer(503, {"error": f"upstream: {exc}"})
            return
        if corrupt and answer.status == 200:
            result = json.loads(answer.read())
            for choice in result.get("choices") or []:
                choice["text"] = shifted(choice.get("text") or "")
            upstream.close()
            sys.stderr.write("corrupted a completion\n")
            self._answer(200, result)
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


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until killed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("port", type=int)
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("fault", choices=["cap", "corrupt", "sample"])
    when = ap.add_mutually_exclusive_group(required=True)
    when.add_argument("--when-venv", nargs=2, metavar=("VENV_LINK", "VERSION"))
    when.add_argument("--when-unit", nargs=2, metavar=("UNIT_FILE", "MARKER"))
    args = ap.parse_args(argv)
    FaultyEngine.upstream_port = args.upstream_port
    FaultyEngine.fault = args.fault
    FaultyEngine.trigger = ("venv", *args.when_venv) if args.when_venv else ("unit", *args.when_unit)
    ThreadingHTTPServer(("127.0.0.1", args.port), FaultyEngine).serve_forever()


if __name__ == "__main__":
    main()
