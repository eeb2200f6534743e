"""A small client of smg's worker API (``GET/POST /workers``, ``DELETE /workers/{id}``).

Kept instead of ``ansible.builtin.uri``: one module call finds, compares, changes and polls a worker
in process, where ``uri`` would take six tasks and a module round trip per poll
(docs/architecture.md, 'Hand-written code beside a library or builtin').

Shared by the ``smg_worker`` module and the tests (``tests/gateway/test_gateway.py``); standard
library only, so it runs with any host Python. The control-plane key is read from the
gateway's environment file on the host (``SMG_CONTROL_PLANE_API_KEY=...``), so it never
travels as a module argument and never appears in a result.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

KEY_VARIABLE = "SMG_CONTROL_PLANE_API_KEY"


class GatewayError(Exception):
    """A problem with the gateway or a worker at it; the message is one sentence."""


def read_key(path: str) -> str:
    """The control-plane key from an environment file (``NAME=value`` lines, ``#`` comments)."""
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, sep, value = line.strip().partition("=")
                if sep and name.strip() == KEY_VARIABLE:
                    return value.strip().strip('"').strip("'")
    except OSError as exc:
        raise GatewayError(f"cannot read the gateway's key file {path}: {exc.strerror}") from exc
    raise GatewayError(f"the gateway's key file {path} has no {KEY_VARIABLE}= line")


class Gateway:
    """The worker API of one smg gateway."""

    def __init__(self, url: str, key: str, timeout_s: float = 10.0, ca_file: str = "") -> None:
        """``ca_file``: the CA that verifies an https gateway's certificate ('' for the system's CAs)."""
        self.url = url.rstrip("/")
        self._key = key
        self.timeout_s = timeout_s
        # The key goes only to a gateway whose certificate the CA verifies for the URL's host.
        self._tls = ssl.create_default_context(cafile=ca_file or None) if self.url.startswith("https://") else None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """One request; returns (HTTP status, parsed JSON or text). Never raises on HTTP errors."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._tls) as response:  # noqa: S310
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GatewayError(f"the gateway at {self.url} did not answer {method} {path}: {reason}") from exc
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            return status, raw.decode(errors="replace")

    def workers(self) -> list[dict[str, Any]]:
        """Every worker the gateway knows, as ``GET /workers`` lists them."""
        status, data = self._call("GET", "/workers")
        if status in (401, 403):
            raise GatewayError(
                f"the gateway at {self.url} refused the control-plane key (HTTP {status}): "
                "set gateway_control_plane_api_key to the key the gateway was started with"
            )
        if status != 200 or not isinstance(data, dict):
            raise GatewayError(f"GET {self.url}/workers answered HTTP {status}: {str(data)[:200]}")
        return list(data.get("workers") or [])

    def find(self, url: str) -> dict[str, Any] | None:
        """The worker registered at ``url`` (trailing slashes ignored), or None."""
        wanted = url.rstrip("/")
        for worker in self.workers():
            if str(worker.get("url", "")).rstrip("/") == wanted:
                return worker
        return None

    def add(self, spec: dict[str, Any]) -> None:
        """``POST /workers`` (the gateway registers it in the background)."""
        status, data = self._call("POST", "/workers", spec)
        if status not in (200, 201, 202):
            raise GatewayError(f"the gateway refused worker {spec.get('url')} (HTTP {status}): {str(data)[:300]}")

    def remove(self, worker_id: str) -> None:
        """``DELETE /workers/{id}``: smg stops routing to it, drains it briefly, then drops it."""
        status, data = self._call("DELETE", f"/workers/{worker_id}")
        if status not in (200, 202, 204, 404):
            raise GatewayError(f"the gateway refused to remove worker {worker_id} (HTTP {status}): {str(data)[:300]}")


def routable(worker: dict[str, Any] | None) -> bool:
    """True when the gateway routes requests to this worker (ready and healthy)."""
    return bool(worker) and worker.get("status") == "ready" and worker.get("is_healthy") is True


def worker_spec(url: str, runtime_type: str, model_id: str, aliases: list[str]) -> dict[str, Any]:
    """The ``POST /workers`` body: the runtime is named, so smg need not detect the backend.

    ``transformers serve`` answers ``/v1/models`` with an empty list for a local model path
    (and, for a model in its HF cache, with entries smg fails to decode), and has neither
    ``/version`` nor ``/server_info``; with ``runtime_type`` and ``models`` given, smg
    registers it as a generic OpenAI-compatible worker. Clients use an alias (the model's
    stable name); smg rewrites it to the worker's own id before forwarding.
    """
    spec: dict[str, Any] = {"url": url}
    if runtime_type:
        spec["runtime_type"] = runtime_type
    if model_id:
        card: dict[str, Any] = {"id": model_id}
        if aliases:
            card["aliases"] = [a for a in aliases if a and a != model_id]
        spec["models"] = [card]
    return spec


def matches(worker: dict[str, Any], spec: dict[str, Any]) -> bool:
    """True when a registered worker already carries the spec's runtime and model."""
    if spec.get("runtime_type") and worker.get("runtime_type") != spec["runtime_type"]:
        return False
    for card in spec.get("models", []):
        listed = {m.get("id"): m for m in worker.get("models") or []}
        if card["id"] not in listed:
            return False
        if sorted(card.get("aliases", [])) != sorted(listed[card["id"]].get("aliases") or []):
            return False
    return True


def wait_for(condition: Callable[[], tuple[bool, Any]], timeout_s: float, interval_s: float) -> tuple[bool, Any, float]:
    """Poll ``condition`` until it returns (True, value) or ``timeout_s`` passes.

    Returns (met, last value, seconds waited).
    """
    started = time.monotonic()
    while True:
        met, value = condition()
        waited = time.monotonic() - started
        if met or waited >= timeout_s:
            return met, value, round(waited, 2)
        time.sleep(interval_s)
