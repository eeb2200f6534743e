#!/usr/bin/env python3
"""A stand-in for the Hugging Face Hub answering every request as for a gated repository.

``gated-hub.py PORT``: HTTP 401 with ``X-Error-Code: GatedRepo`` (what huggingface.co sends
to a client without a token that has been granted access), so huggingface_hub raises
GatedRepoError. The real Hub cannot be reached from the machines this project is tested on.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Gated(BaseHTTPRequestHandler):
    """Refuse everything like a gated repo."""

    def _refuse(self) -> None:
        message = "Access to model Qwen/Qwen3.6-27B is restricted. You must have access to it and be authenticated."
        body = json.dumps({"error": message}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "GatedRepo")
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = _refuse  # noqa: N815 - http.server API

    def log_message(self, fmt: str, *args: object) -> None:
        """Log the request line (with the Authorization header's presence, never its value)."""
        sys.stderr.write("{} auth={}\n".format(fmt % args, "yes" if self.headers.get("authorization") else "no"))


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Gated).serve_forever()
