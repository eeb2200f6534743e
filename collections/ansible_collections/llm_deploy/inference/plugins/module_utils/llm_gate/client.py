# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The HTTP side: the server's endpoint (base URL, API key) and quoting of its answers."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from typing import TYPE_CHECKING, Any

from .config import SCHEMA_VERSION

if TYPE_CHECKING:
    from .listener import ListenerGuard

BODY_QUOTE_CHARS = 2000


def quote_body(body: bytes, limit: int = BODY_QUOTE_CHARS) -> str:
    """A response body as text for an error message, cut at ``limit`` characters."""
    text = body.decode("utf-8", "replace").strip()
    if len(text) > limit:
        return text[:limit] + f"... ({len(text) - limit} more characters)"
    return text


class _Guarded:
    """A connection that asks its guard (:mod:`.listener`) who listens before it connects and who
    accepted it after, before a byte (the key in the headers) is sent."""

    guard: ListenerGuard | None = None
    sock: Any

    def connect(self) -> None:
        """Connect, between the guard's two checks."""
        if self.guard is not None:
            self.guard.check()
        super().connect()  # type: ignore[misc]
        if self.guard is not None:
            self.guard.verify(self.sock)


class _GuardedHTTP(_Guarded, http.client.HTTPConnection):
    """Plain HTTP, guarded."""


class _GuardedHTTPS(http.client.HTTPSConnection):
    """HTTPS, guarded (the check of who accepted is made once TLS is up, still before the request), its
    certificate verified for ``server_name`` (the URL's host when empty) with the connection's context."""

    guard: ListenerGuard | None = None
    server_name = ""

    def connect(self) -> None:
        """Connect, TLS up for ``server_name``, between the guard's two checks."""
        if self.guard is not None:
            self.guard.check()
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.server_name or self.host)  # type: ignore[attr-defined]
        if self.guard is not None:
            self.guard.verify(self.sock)


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    """A client context that verifies certificates with ``ca_file`` (PEM), or with the system's CAs when ''.

    :class:`OSError` or :class:`ssl.SSLError` when ``ca_file`` cannot be read as PEM certificates.
    """
    return ssl.create_default_context(cafile=ca_file or None)


class Endpoint:
    """Base URL of the server plus the optional API key (sent as a Bearer token) and the guard that
    checks, before every connection, who listens on the port (:mod:`.listener`)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        guard: ListenerGuard | None = None,
        tls: ssl.SSLContext | None = None,
        server_name: str = "",
    ) -> None:
        """Split ``url`` into scheme, host, port and path prefix; an https URL's certificate is verified with
        ``tls`` (:func:`tls_context`; the system's CAs when None) for ``server_name`` (the URL's host when '')."""
        parts = urllib.parse.urlsplit(url)
        self.scheme = parts.scheme
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key or None
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.display = f"{self.scheme}://{host}:{self.port}{self.prefix}"
        self.guard = guard
        self.tls = tls
        self.server_name = server_name

    def with_key(self, api_key: str | None) -> Endpoint:
        """The same server, guard and TLS settings with another key (the admin key of an admin endpoint)."""
        return Endpoint(self.display, api_key, self.guard, self.tls, self.server_name)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (one per request: simple and safe across threads); it connects on its first
        request, and then, with a guard, only after the guard's checks (:class:`_Guarded`)."""
        if self.scheme == "https":
            conn: http.client.HTTPConnection = _GuardedHTTPS(
                self.host, self.port, timeout=timeout, context=self.tls or tls_context()
            )
            conn.server_name = self.server_name  # type: ignore[attr-defined]
        else:
            conn = _GuardedHTTP(self.host, self.port, timeout=timeout)
        conn.guard = self.guard  # type: ignore[attr-defined]
        return conn

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
