# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Readiness: poll ``/health`` until the server answers 200, while the monitor watches it."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .client import Endpoint, quote_body
from .errors import GateFailure
from .monitor import Monitor
from .stats import rounded

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .config import GateConfig

HEALTH_PATH = "/health"

STATE_TEXT = {
    "loading": "still loading (connection refused)",
    "warming": "warming up (HTTP 503 from /health)",
    "unresponsive": "not answering /health",
    "http_error": "answering /health with an error",
    "ready": "ready",
}


PHASE_TEXT = {
    "watch": "starting to watch",
    "wait": "waiting for the server",
    "loading": "the server was loading",
    "warming": "the server was warming up",
    "unresponsive": "/health did not answer",
    "http_error": "/health answered errors",
    "ready": "the server was ready",
    "discover": "discovering the server",
    "warmup": "sending warm-up requests",
    "measure": "measuring",
    "speculative": "reading the accept length and the running-request limit",
    "correctness": "asking the correctness probe",
}


def probe_health(endpoint: Endpoint, timeout: float) -> tuple[str, str]:
    """One ``GET /health``: (state, detail) with state in :data:`STATE_TEXT`."""
    try:
        status, body = endpoint.request("GET", HEALTH_PATH, timeout=timeout)
    except ConnectionRefusedError:
        return "loading", "connection refused"
    except socket.gaierror as exc:
        raise GateFailure("wait", f"cannot resolve the server's host {endpoint.host}: {exc}") from exc
    except (socket.timeout, TimeoutError):  # noqa: UP041 - two classes before Python 3.10
        return "unresponsive", f"no answer within {timeout:.0f} s"
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        return "loading", f"{type(exc).__name__}: {exc}"
    if status == 200:
        return "ready", "HTTP 200"
    if status == 503:
        return "warming", f"HTTP 503: {quote_body(body, 300)}"
    return "http_error", f"HTTP {status}: {quote_body(body, 300)}"


def wait_ready(
    endpoint: Endpoint,
    cfg: GateConfig,
    monitor: Monitor,
    progress: Callable[[str], None],
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Poll ``/health`` until 200 or the deadline; return the readiness record.

    ``record`` (filled as the wait goes on, so it is complete even when the wait fails)
    holds the states seen and when. The deadline message names the state the server
    was stuck in and for how long ("warming up (HTTP 503 from /health) for 1790 s").
    """
    start = time.monotonic()
    deadline = start + cfg.ready_timeout_s
    record = record if record is not None else {}
    phases: list[dict[str, Any]] = []
    record.update({"ready_after_s": None, "polls": 0, "phases": phases})
    state, detail, since = "", "", start
    polls = 0
    while True:
        monitor.phase = state or "wait"
        monitor.check()
        remaining = deadline - time.monotonic()
        new_state, detail = monitor.call(probe_health, endpoint, max(0.5, min(cfg.health_timeout_s, remaining)))
        polls += 1
        record["polls"] = polls
        now = time.monotonic()
        if new_state != state:
            state, since = new_state, now
            phases.append({"state": state, "at_s": rounded(now - start, 3), "detail": detail})
            progress(STATE_TEXT[state] if state in ("ready", "loading") else f"{STATE_TEXT[state]}: {detail}")
        monitor.phase = state
        if state == "ready":
            record["ready_after_s"] = rounded(now - start, 3)
            return record
        if now >= deadline:
            raise GateFailure(
                state,
                f"server at {endpoint.display} not ready after {now - start:.0f} s "
                f"(ready_timeout_s {cfg.ready_timeout_s:.0f}): {STATE_TEXT[state]} for {now - since:.0f} s; "
                f"last answer: {detail}",
            )
        monitor.wait(min(cfg.poll_interval_s, max(deadline - now, 0.05)))
