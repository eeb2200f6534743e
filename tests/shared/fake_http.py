"""What the tests' fake HTTP servers share: a quiet HTTP/1.1 handler that answers JSON, and a
threaded server on 127.0.0.1 that serves from a daemon thread.

``gate_fakes.FakeLLMServer`` (an OpenAI/SGLang-like server scripted per test) and
``fake_sglang_lm.FakeSGLangLM`` (SGLang's native API over a toy model) are built on it.
Standard library only: tests/tools/test_gpu_tools.py copies it into a fake SGLang bundle
beside the toy model.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

Served = TypeVar("Served", bound="BackgroundServer")


class JSONHandler(BaseHTTPRequestHandler):
    """A request handler that speaks HTTP/1.1, logs nothing and answers with :meth:`_answer` or :meth:`_json`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        """Quiet: no access log on stderr."""

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        """Answer ``status`` with ``body`` (its length in ``Content-Length``)."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        """Answer ``status`` with ``obj`` as JSON."""
        self._answer(status, json.dumps(obj).encode())


class _Server(ThreadingHTTPServer):
    """A request's thread does not hold up the test's exit; a test's port is free again at once."""

    daemon_threads = True
    allow_reuse_address = True


class BackgroundServer:
    """``handler`` served on 127.0.0.1 (``port`` 0: a free one, in ``port`` and ``url``) from a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        """Bind now; serve from :meth:`start` on."""
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.port: int = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port:d}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self: Served) -> Served:
        """Serve in the background thread."""
        self.thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
