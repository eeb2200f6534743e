# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The HTTP side: the server's endpoint (base URL, API key) and quoting of its answers."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

from .config import SCHEMA_VERSION

BODY_QUOTE_CHARS = 2000


def quote_body(body: bytes, limit: int = BODY_QUOTE_CHARS) -> str:
    """A response body as text for an error message, cut at ``limit`` characters."""
    text = body.decode("utf-8", "replace").strip()
    if len(text) > limit:
        return text[:limit] + f"... ({len(text) - limit} more characters)"
    return text


class Endpoint:
    """Base URL of the server plus the optional API key (sent as a Bearer token)."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        """Split ``url`` into scheme, host, port and path prefix."""
        parts = urllib.parse.urlsplit(url)
        self.scheme = parts.scheme
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key or None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.display = f"{self.scheme}://{host}:{self.port}{self.prefix}"

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (one per request: simple and safe across threads)."""
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Request headers, with ``Authorization`` when an API key is set."""
        headers = {"User-Agent": f"llm-deploy-health-gate/{SCHEMA_VERSION}"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        headers.update(extra or {})
        return headers

    def request(self, method: str, path: str, payload: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
        """One plain request; returns (status, body). Network errors propagate."""
        conn = self.connect(timeout)
        try:
            body = None
            headers = self.headers()
            if payload is not None:
                body = json.dumps(payload).encode("utf-8")
                headers["Content-Type"] = "application/json"
            conn.request(method, self.prefix + path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def get_json(self, path: str, timeout: float) -> tuple[int, Any]:
        """GET ``path``; (status, parsed JSON or None)."""
        status, body = self.request("GET", path, timeout=timeout)
        try:
            return status, json.loads(body.decode("utf-8")) if body else None
        except ValueError:
            return status, None
