# -*- coding: utf-8 -*-
# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Health-and-throughput gate for OpenAI-compatible LLM servers (SGLang, transformers serve).

One implementation, two front ends: the Ansible module ``health_gate``
(``roles/health_gate/library/health_gate.py``, which imports this file as
``ansible.module_utils.llm_gate``) and the command line ``tools/health-gate``.
It runs on the target host with the host's system ``python3``: standard library only,
Python 3.8 or newer.

What a gate run does, in order (:func:`run_gate`):

1. **Readiness.** Poll ``GET /health`` until it answers 200 or the deadline passes.
   Connection refused means "still loading" (SGLang opens its port only after the
   weights are loaded), HTTP 503 means "warming up". Meanwhile a watcher looks at the
   systemd unit (or a PID): if the unit fails, exits or restarts, the gate fails at once
   with the unit's state and the journal of *this* start of the unit.
2. **Discovery.** Engine (``/server_info`` or ``/get_server_info`` answers: SGLang),
   server version, model id (``/v1/models``, or the ``model`` option).
3. **Measurement.** Warm-up requests, then N streaming chat completions
   (temperature 0, fixed ``max_tokens``, ``stream_options.include_usage``) with a
   configurable concurrency. Per request: TTFT, inter-chunk latency, decode tokens/s
   = (completion_tokens - 1) / (t_last_token - t_first_token), end-to-end latency.
   Token counts come from the server's ``usage``, never from chunk counts.
4. **Speculative decoding** (SGLang): the MTP accept length from ``/server_info``
   ``internal_states[0].avg_spec_accept_length``, else from a ``/generate`` call's
   ``meta_info.spec_accept_length``.
5. **Verdict.** Mean decode tok/s >= ``min_decode_tps``, TTFT p95 <= ``max_ttft_s``,
   accept length >= ``min_accept_length`` (only when the engine reports one).

The result is one JSON-serialisable report (:func:`run_gate` never raises for a failed
gate, only :class:`GateUsageError` for bad options); :func:`store_report` keeps it on
disk as ``<UTC timestamp>.json`` plus ``latest.json`` and prunes the history.
"""

from __future__ import annotations

import datetime
import http.client
import json
import math
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.parse
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SCHEMA_VERSION = 1
ENGINES = ("auto", "sglang", "transformers", "generic")
CHAT_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
REPORT_NAME_RE = re.compile(r"^\d{8}T\d{6}Z(?:-\d+)?\.json$")
TTFT_STATISTIC = "p95"
BODY_QUOTE_CHARS = 2000

# Option defaults, shared by the module's argument_spec, the CLI and the role's defaults.
DEFAULTS: Dict[str, Any] = {
    "url": "http://127.0.0.1:30000",
    "unit": None,
    "pid": None,
    "log_file": None,
    "model": None,
    "api_key": None,
    "engine": "auto",
    "ready_timeout_s": 1800.0,
    "poll_interval_s": 1.0,
    "health_timeout_s": 30.0,
    "request_timeout_s": 300.0,
    "warmup_requests": 2,
    "requests": 8,
    "concurrency": 1,
    "max_tokens": 256,
    "prompts": None,
    "min_decode_tps": 0.0,
    "max_ttft_s": 0.0,
    "min_accept_length": 0.0,
    "baseline": None,
    "max_regression_pct": 0.0,
    "regression_min_ttft_delta_s": 0.1,
    "allow_prior_restarts": False,
    "journal_max_lines": 3000,
    "journal_max_bytes": 512 * 1024,
    "report_dir": None,
    "keep_reports": 20,
    "metadata": {},
}

# Used when no prompts are given (ad-hoc module use); the role ships files/prompts.json.
FALLBACK_PROMPTS: List[Dict[str, Any]] = [
    {
        "id": "fallback-log-parser",
        "messages": [
            {
                "role": "user",
                "content": (
                    "Write a Python function that reads an nginx access log and returns the ten client "
                    "IP addresses with the most 5xx responses. Use type hints and a docstring, then add "
                    "a short pytest test for it."
                ),
            }
        ],
    },
    {
        "id": "fallback-lru-cache",
        "messages": [
            {
                "role": "user",
                "content": (
                    "Implement an LRU cache class in Python with get and put in O(1), without using "
                    "functools. Explain the data structures you chose."
                ),
            }
        ],
    },
]


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class GateUsageError(ValueError):
    """Bad options: nothing was measured (CLI exit code 2, module fails before measuring)."""


class RequestError(Exception):
    """One HTTP request to the server failed; the message quotes what the server said."""


class WatchFailure(object):
    """What the watcher saw when the supervised server failed, exited or restarted."""

    def __init__(
        self,
        kind: str,
        reason: str,
        state: Optional[Dict[str, Any]] = None,
        log: str = "",
        log_lines: int = 0,
        log_capped: bool = False,
        log_source: str = "",
        exception: Optional[str] = None,
    ) -> None:
        self.kind = kind
        self.reason = reason
        self.state = state or {}
        self.log = log
        self.log_lines = log_lines
        self.log_capped = log_capped
        self.log_source = log_source
        self.exception = exception

    def as_dict(self) -> Dict[str, Any]:
        """Evidence for the report."""
        return {
            "watch": self.kind,
            "reason": self.reason,
            "state": self.state,
            "exception": self.exception,
            "log_source": self.log_source,
            "log_lines": self.log_lines,
            "log_capped": self.log_capped,
            "log": self.log,
        }


class GateFailure(Exception):
    """The gate failed in ``phase``; ``reason`` is one sentence, ``watch`` the unit evidence."""

    def __init__(
        self, phase: str, reason: str, watch: Optional[WatchFailure] = None, detail: Optional[Dict[str, Any]] = None
    ) -> None:
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.watch = watch
        self.detail = detail or {}


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------


def make_config(options: Dict[str, Any]) -> Dict[str, Any]:
    """Merge ``options`` over :data:`DEFAULTS` (``None`` values fall back to the default)."""
    cfg = dict(DEFAULTS)
    for key, value in options.items():
        if key not in DEFAULTS:
            raise GateUsageError("unknown option %r" % key)
        if value is not None:
            cfg[key] = value
    cfg["metadata"] = dict(cfg.get("metadata") or {})
    return cfg


def _number(cfg: Dict[str, Any], key: str, errors: List[str], integer: bool = False) -> Optional[float]:
    value = cfg.get(key)
    if isinstance(value, bool):
        errors.append("%s must be a number, not %r" % (key, value))
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        errors.append("%s must be %s, got %r" % (key, "an integer" if integer else "a number", value))
        return None
    if integer and float(value) != number:
        errors.append("%s must be an integer, got %r" % (key, value))
        return None
    if not integer and (math.isnan(number) or math.isinf(number)):
        errors.append("%s must be finite, got %r" % (key, value))
        return None
    cfg[key] = number
    return number


def validate_config(cfg: Dict[str, Any]) -> Dict[str, Any]:
    """Check every option; raise :class:`GateUsageError` listing all problems at once.

    Converts numbers in place, loads ``prompts`` (path or list) into a list of
    ``{"id", "messages"}`` and returns ``cfg``.
    """
    errors: List[str] = []
    url = str(cfg.get("url") or "")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        errors.append("url must look like http://HOST:PORT, got %r" % url)
    else:
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError:
            errors.append("url has an invalid port: %r" % url)
    if cfg.get("engine") not in ENGINES:
        errors.append("engine must be one of %s, got %r" % (", ".join(ENGINES), cfg.get("engine")))
    positive = ("ready_timeout_s", "poll_interval_s", "health_timeout_s", "request_timeout_s")
    for key in positive:
        value = _number(cfg, key, errors)
        if value is not None and value <= 0:
            errors.append("%s must be greater than 0, got %s" % (key, value))
    for key, low in (
        ("requests", 1),
        ("concurrency", 1),
        ("warmup_requests", 0),
        ("max_tokens", 2),
        ("keep_reports", 1),
        ("journal_max_lines", 10),
        ("journal_max_bytes", 1024),
    ):
        value = _number(cfg, key, errors, integer=True)
        if value is not None and value < low:
            why = " (decode speed needs at least 2 tokens)" if key == "max_tokens" else ""
            errors.append("%s must be at least %d, got %d%s" % (key, low, value, why))
    for key in ("min_decode_tps", "max_ttft_s", "min_accept_length", "max_regression_pct",
                "regression_min_ttft_delta_s"):
        value = _number(cfg, key, errors)
        if value is not None and value < 0:
            errors.append("%s must be 0 (no check) or positive, got %s" % (key, value))
    baseline = cfg.get("baseline")
    if baseline is not None and not isinstance(baseline, dict):
        errors.append("baseline must be a mapping of the last-known-good's figures")
    elif baseline:
        for key in BASELINE_FIGURES:
            if baseline.get(key) is not None and (isinstance(baseline[key], bool)
                                                  or not isinstance(baseline[key], (int, float))):
                errors.append("baseline.%s must be a number, got %r" % (key, baseline[key]))
    if cfg.get("pid") is not None:
        pid = _number(cfg, "pid", errors, integer=True)
        if pid is not None and pid <= 0:
            errors.append("pid must be a positive process id, got %s" % pid)
        if cfg.get("unit"):
            errors.append("watch either a unit or a pid, not both")
    if not isinstance(cfg.get("metadata"), dict):
        errors.append("metadata must be a mapping")
    if cfg.get("unit") is not None and not isinstance(cfg.get("unit"), str):
        errors.append("unit must be a string")
    try:
        cfg["prompts"] = load_prompts(cfg.get("prompts"))
    except GateUsageError as exc:
        errors.append(str(exc))
    if errors:
        raise GateUsageError("; ".join(errors))
    cfg["allow_prior_restarts"] = bool(cfg.get("allow_prior_restarts"))
    return cfg


def load_prompts(value: Any) -> List[Dict[str, Any]]:
    """Turn a prompts option into ``[{"id": str, "messages": [...]}, ...]``.

    Accepts ``None`` (built-in fallback), a path to a JSON file holding a list or
    ``{"prompts": [...]}``, or a list. Each prompt is a string (one user message) or a
    mapping with ``messages`` (OpenAI chat format) and an optional ``id``.
    """
    if value is None or value == "" or value == []:
        return [dict(p) for p in FALLBACK_PROMPTS]
    source = "prompts"
    if isinstance(value, str):
        source = value
        try:
            with open(value, "r", encoding="utf-8") as handle:
                value = json.load(handle)
        except (OSError, ValueError) as exc:
            raise GateUsageError("cannot read prompts from %s: %s" % (source, exc))
    if isinstance(value, dict) and "prompts" in value:
        value = value["prompts"]
    if not isinstance(value, list) or not value:
        raise GateUsageError("%s must be a non-empty list of prompts" % source)
    prompts: List[Dict[str, Any]] = []
    for index, item in enumerate(value):
        if isinstance(item, str) and item.strip():
            prompts.append({"id": "prompt-%d" % index, "messages": [{"role": "user", "content": item}]})
            continue
        if isinstance(item, dict) and isinstance(item.get("messages"), list) and item["messages"]:
            ok = all(
                isinstance(m, dict) and m.get("role") and isinstance(m.get("content"), str) for m in item["messages"]
            )
            if ok:
                prompts.append({"id": str(item.get("id") or "prompt-%d" % index), "messages": item["messages"]})
                continue
        raise GateUsageError(
            "%s: prompt %d must be a string or a mapping with a messages list " "of {role, content}" % (source, index)
        )
    return prompts


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> Optional[float]:
    """Percentile with linear interpolation between closest ranks (numpy's default).

    ``percentile([1, 2, 3, 4], 50) == 2.5``; one value is its own percentile; ``None``
    for no values.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def decode_tps(completion_tokens: int, t_first: float, t_last: float) -> Optional[float]:
    """Decode speed of one request: tokens after the first over the time after the first.

    ``None`` when it cannot be measured (one token, or all tokens in one chunk).
    """
    span = t_last - t_first
    if completion_tokens < 2 or span <= 0:
        return None
    return (completion_tokens - 1) / span


def _mean(values: Sequence[float]) -> Optional[float]:
    return statistics.mean(values) if values else None


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _r(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(float(value), digits)


def aggregate(results: Sequence["RequestResult"], wall_s: float) -> Dict[str, Any]:
    """Aggregate figures over the measured requests.

    Decode tok/s is the mean (and median) of the per-request figures; ``total_tps`` is
    all completion tokens over the wall time of the measurement (it grows with
    concurrency, the per-request figure does not). Inter-token latency pools the gaps
    between content chunks of every request.
    """
    tps = [r.decode_tps for r in results if r.decode_tps is not None]
    ttft = [r.ttft_s for r in results]
    e2e = [r.e2e_s for r in results]
    gaps = [g for r in results for g in r.gaps]
    completion = sum(r.completion_tokens for r in results)
    prompt = sum(r.prompt_tokens for r in results)
    chunks = sum(r.content_chunks for r in results)
    return {
        "requests": len(results),
        "requests_with_decode": len(tps),
        "decode_tps_mean": _r(_mean(tps), 3),
        "decode_tps_median": _r(_median(tps), 3),
        "decode_tps_min": _r(min(tps) if tps else None, 3),
        "decode_tps_max": _r(max(tps) if tps else None, 3),
        "ttft_p50_s": _r(percentile(ttft, 50)),
        "ttft_p95_s": _r(percentile(ttft, 95)),
        "ttft_max_s": _r(max(ttft) if ttft else None),
        "itl_mean_s": _r(_mean(gaps), 5),
        "itl_p95_s": _r(percentile(gaps, 95), 5),
        "e2e_p50_s": _r(percentile(e2e, 50)),
        "e2e_p95_s": _r(percentile(e2e, 95)),
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "tokens_per_chunk": _r(completion / chunks if chunks else None, 3),
        "wall_s": _r(wall_s, 3),
        "total_tps": _r(completion / wall_s if wall_s > 0 else None, 3),
    }


# --------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------

_KEY_PATTERN = re.compile(
    r"""(api[_-]?key['"]?\s*[=:]\s*|--api-key[=\s]+|Bearer\s+)(['"]?)([^'"\s,)]+)""", re.IGNORECASE
)


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """Hide ``secrets`` and anything that looks like ``api_key=...`` or a Bearer token.

    SGLang logs its server arguments (api_key included) at start-up and echoes them in
    ``/server_info``; a journal quoted as evidence must not leak the key.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _KEY_PATTERN.sub(
        lambda m: m.group(1) + m.group(2) + ("***" if m.group(3) not in ("None", "null", "") else m.group(3)), text
    )


def redact(obj: Any, secrets: Sequence[str]) -> Any:
    """Redact every string inside ``obj`` (dicts, lists) with :func:`redact_text`."""
    if isinstance(obj, str):
        return redact_text(obj, secrets)
    if isinstance(obj, dict):
        return {k: redact(v, secrets) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    return obj


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------


def quote_body(body: bytes, limit: int = BODY_QUOTE_CHARS) -> str:
    """A response body as text for an error message, cut at ``limit`` characters."""
    text = body.decode("utf-8", "replace").strip()
    if len(text) > limit:
        return text[:limit] + "... (%d more characters)" % (len(text) - limit)
    return text


class Endpoint(object):
    """Base URL of the server plus the optional API key (sent as a Bearer token)."""

    def __init__(self, url: str, api_key: Optional[str] = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.scheme = parts.scheme
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key or None
        host = "[%s]" % self.host if ":" in self.host else self.host
        self.display = "%s://%s:%d%s" % (self.scheme, host, self.port, self.prefix)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        """A new connection (one per request: simple and safe across threads)."""
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """Request headers, with ``Authorization`` when an API key is set."""
        headers = {"User-Agent": "llm-deploy-health-gate/%d" % SCHEMA_VERSION}
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        headers.update(extra or {})
        return headers

    def request(self, method: str, path: str, payload: Any = None, timeout: float = 10.0) -> Tuple[int, bytes]:
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

    def get_json(self, path: str, timeout: float) -> Tuple[int, Any]:
        """GET ``path``; (status, parsed JSON or None)."""
        status, body = self.request("GET", path, timeout=timeout)
        try:
            return status, json.loads(body.decode("utf-8")) if body else None
        except ValueError:
            return status, None


# --------------------------------------------------------------------------------------
# Watchers: the unit (systemd) or a PID
# --------------------------------------------------------------------------------------

UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "NRestarts",
    "InvocationID",
    "MainPID",
    "ExecMainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "ActiveEnterTimestamp",
    "ExecMainStartTimestamp",
)
EXCEPTION_RE = re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b.*")
CLD_CODES = {"1": "exited", "2": "killed", "3": "dumped core"}


def last_exception_line(text: str) -> Optional[str]:
    """The last line that looks like a raised Python exception (``ValueError: ...``)."""
    for line in reversed(text.splitlines()):
        if EXCEPTION_RE.match(line) and "Traceback" not in line:
            return line.strip()
    return None


def cap_lines(text: str, max_lines: int, max_bytes: int) -> Tuple[str, int, bool]:
    """Keep the last ``max_lines`` lines and at most ``max_bytes``; (text, lines, capped)."""
    lines = text.splitlines()
    capped = len(lines) > max_lines
    lines = lines[-max_lines:]
    out = "\n".join(lines)
    if len(out.encode("utf-8")) > max_bytes:
        capped = True
        raw = out.encode("utf-8")[-max_bytes:]
        out = raw.decode("utf-8", "replace")
        out = out.split("\n", 1)[1] if "\n" in out else out
    return out, len(out.splitlines()), capped


class NullWatcher(object):
    """Watches nothing (a server run by someone else)."""

    kind = "none"

    def baseline(self) -> None:
        """Nothing to record."""

    def poll(self) -> Optional[WatchFailure]:
        """Never fails."""
        return None

    def describe(self) -> Optional[Dict[str, Any]]:
        """No state."""
        return None


class UnitWatcher(object):
    """Watches a systemd unit with ``systemctl show``; reads this start's journal on failure.

    A failure is: the unit is not loaded, is ``failed`` or ``inactive``, sits in
    ``auto-restart``, its ``NRestarts`` grew, or its ``InvocationID`` changed (someone or
    something restarted it). ``NRestarts`` is reset by a manual (re)start, so a value above
    zero at the start of the gate means the unit crashed and was restarted by systemd
    since it was last started on purpose: a failure unless ``allow_prior_restarts``.
    """

    kind = "unit"

    def __init__(
        self,
        unit: str,
        max_lines: int,
        max_bytes: int,
        allow_prior_restarts: bool = False,
        runner: Optional[Callable[..., subprocess.CompletedProcess]] = None,
    ) -> None:
        self.unit = unit if "." in unit else unit + ".service"
        self.max_lines = max_lines
        self.max_bytes = max_bytes
        self.allow_prior_restarts = allow_prior_restarts
        self.runner = runner or subprocess.run
        self.first: Dict[str, str] = {}
        self.last: Dict[str, str] = {}

    def _run(self, argv: List[str], timeout: float = 15.0) -> subprocess.CompletedProcess:
        env = dict(os.environ, SYSTEMD_PAGER="", SYSTEMD_COLORS="0", LC_ALL="C")
        return self.runner(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env, check=False)

    def show(self) -> Dict[str, str]:
        """``systemctl show`` of the unit as a dict."""
        try:
            proc = self._run(["systemctl", "show", self.unit, "--no-pager", "--property=" + ",".join(UNIT_PROPERTIES)])
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GateFailure("watch", "cannot run systemctl to watch %s: %s" % (self.unit, exc))
        if proc.returncode != 0:
            raise GateFailure(
                "watch",
                "systemctl show %s failed (exit %d): %s"
                % (self.unit, proc.returncode, proc.stderr.decode("utf-8", "replace").strip()),
            )
        props: Dict[str, str] = {}
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                props[key] = value
        return props

    def describe(self) -> Optional[Dict[str, Any]]:
        """Last seen state, for the report."""
        state = self.last or self.first
        if not state:
            return None
        out: Dict[str, Any] = {"name": self.unit}
        out.update(state)
        return out

    def _exit_text(self, props: Dict[str, str]) -> str:
        code = props.get("ExecMainCode", "0")
        status = props.get("ExecMainStatus", "0")
        if code in ("2", "3"):
            try:
                name = signal.Signals(int(status)).name
            except (ValueError, TypeError):
                name = "signal %s" % status
            return "main process %s by %s" % (CLD_CODES[code], name)
        if code == "1":
            return "main process exited with status %s" % status
        return "main process running"

    def _verdict(self, props: Dict[str, str], initial: bool) -> Optional[str]:
        active, sub = props.get("ActiveState", ""), props.get("SubState", "")
        where = "%s/%s, result %s, %s" % (active, sub, props.get("Result", "?"), self._exit_text(props))
        if props.get("LoadState") not in (None, "loaded"):
            return "unit %s is not loaded (LoadState=%s)" % (self.unit, props.get("LoadState"))
        if active == "failed":
            return "unit %s failed (%s)" % (self.unit, where)
        if sub == "auto-restart":
            return "unit %s exited and waits to be restarted (%s)" % (self.unit, where)
        if active in ("inactive", "deactivating"):
            return "unit %s is not running (%s)" % (self.unit, where)
        restarts = _int(props.get("NRestarts"))
        if initial:
            if restarts > 0 and not self.allow_prior_restarts:
                return (
                    "unit %s was restarted %d time(s) by systemd since it was last started "
                    "on purpose (NRestarts=%d): it crashed at least once" % (self.unit, restarts, restarts)
                )
            return None
        if restarts > _int(self.first.get("NRestarts")):
            return "unit %s restarted during the gate (NRestarts %s -> %d; %s)" % (
                self.unit,
                self.first.get("NRestarts"),
                restarts,
                where,
            )
        old, new = self.first.get("InvocationID"), props.get("InvocationID")
        if old and new and old != new:
            return "unit %s was restarted during the gate (new invocation %s; %s)" % (self.unit, new, where)
        return None

    def baseline(self) -> None:
        """Record the state at the start; fail at once when the unit is already down."""
        self.first = self.show()
        self.last = self.first
        reason = self._verdict(self.first, initial=True)
        if reason:
            raise GateFailure("watch", reason, watch=self._evidence(reason, self.first))

    def poll(self) -> Optional[WatchFailure]:
        """Look once; a :class:`WatchFailure` with the journal when the unit is down."""
        try:
            props = self.show()
        except GateFailure as exc:
            return WatchFailure("unit", exc.reason)
        self.last = props
        reason = self._verdict(props, initial=False)
        return self._evidence(reason, props) if reason else None

    def journal(self, invocation: str) -> Tuple[str, str]:
        """The journal of one start of the unit: its own output plus systemd's lines about it.

        Reads until two consecutive reads agree (journald may still be flushing the dying
        process's last lines), at most about 2 s.
        """
        if invocation:
            argv = [
                "journalctl",
                "--no-pager",
                "-o",
                "cat",
                "-n",
                str(self.max_lines + 1),
                "_SYSTEMD_INVOCATION_ID=" + invocation,
                "+",
                "INVOCATION_ID=" + invocation,
            ]
            source = "journalctl _SYSTEMD_INVOCATION_ID=%s" % invocation
        else:
            argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(self.max_lines + 1), "-u", self.unit]
            source = "journalctl -u %s (no InvocationID known)" % self.unit
        previous = None
        text = ""
        for _ in range(8):
            try:
                proc = self._run(argv, timeout=30.0)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return "(cannot read the journal: %s)" % exc, source
            text = proc.stdout.decode("utf-8", "replace")
            if proc.returncode != 0 and not text:
                text = "(journalctl exit %d: %s)" % (proc.returncode, proc.stderr.decode("utf-8", "replace").strip())
            if text == previous:
                break
            previous = text
            time.sleep(0.25)
        return text, source

    def _evidence(self, reason: str, props: Dict[str, str]) -> WatchFailure:
        # The start we were watching; at the very beginning, the unit's current/last one.
        invocation = self.first.get("InvocationID") or props.get("InvocationID", "")
        text, source = self.journal(invocation)
        log, lines, capped = cap_lines(text, self.max_lines, self.max_bytes)
        state = {"name": self.unit}
        state.update(props)
        return WatchFailure(
            "unit",
            reason,
            state=state,
            log=log,
            log_lines=lines,
            log_capped=capped,
            log_source=source,
            exception=last_exception_line(log),
        )


class PidWatcher(object):
    """Watches a process id (a server started by hand or by the bench) and its log file."""

    kind = "pid"

    def __init__(self, pid: int, log_file: Optional[str], max_lines: int, max_bytes: int) -> None:
        self.pid = int(pid)
        self.log_file = log_file
        self.max_lines = max_lines
        self.max_bytes = max_bytes

    def alive(self) -> Tuple[bool, str]:
        """(alive, state letter from /proc); a zombie counts as dead."""
        try:
            with open("/proc/%d/stat" % self.pid, "r") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False, "gone"
            except PermissionError:
                return True, "?"
            return True, "?"
        return state not in ("Z", "X", "x"), state

    def describe(self) -> Optional[Dict[str, Any]]:
        """PID and liveness, for the report."""
        alive, state = self.alive()
        return {"pid": self.pid, "alive": alive, "state": state}

    def baseline(self) -> None:
        """Fail at once when the process is not there."""
        failure = self.poll()
        if failure:
            raise GateFailure("watch", failure.reason, watch=failure)

    def poll(self) -> Optional[WatchFailure]:
        """A :class:`WatchFailure` with the log file once the process is gone."""
        alive, state = self.alive()
        if alive:
            return None
        reason = "process %d exited (%s)" % (self.pid, "zombie" if state == "Z" else "no longer exists")
        text, source = "", ""
        if self.log_file:
            source = self.log_file
            previous = None
            for _ in range(8):
                try:
                    with open(self.log_file, "r", encoding="utf-8", errors="replace") as handle:
                        text = handle.read()
                except OSError as exc:
                    text = "(cannot read %s: %s)" % (self.log_file, exc)
                    break
                if text == previous:
                    break
                previous = text
                time.sleep(0.1)
        log, lines, capped = cap_lines(text, self.max_lines, self.max_bytes)
        return WatchFailure(
            "pid",
            reason,
            state={"pid": self.pid, "state": state},
            log=log,
            log_lines=lines,
            log_capped=capped,
            log_source=source,
            exception=last_exception_line(log),
        )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


class Monitor(object):
    """Runs a watcher in a background thread, so the gate fails at once, even mid-request.

    Blocking work goes through :meth:`call` (or polls :meth:`wait`), which raises
    :class:`GateFailure` as soon as the watcher reports a failure.
    """

    def __init__(self, watcher: Any, interval: float) -> None:
        self.watcher = watcher
        self.interval = interval
        self.failure: Optional[WatchFailure] = None
        self.phase = "wait"
        self._event = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Baseline (may raise), then watch in the background."""
        self.watcher.baseline()
        if isinstance(self.watcher, NullWatcher):
            return
        self._thread = threading.Thread(target=self._loop, name="health-gate-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.poll_now():
                return

    def poll_now(self) -> bool:
        """Look once, synchronously; True when the server is down."""
        with self._lock:
            if self.failure is None:
                failure = self.watcher.poll()
                if failure is not None:
                    self.failure = failure
                    self._event.set()
            return self.failure is not None

    def check(self) -> None:
        """Raise when the watcher has seen a failure."""
        if self.failure is not None:
            raise GateFailure(self.phase, self.failure.reason, watch=self.failure)

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; wake up and raise at once if the server goes down."""
        if self._event.wait(max(seconds, 0.0)):
            self.check()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in a thread; raise the watcher's failure if it comes first.

        When ``fn`` raises, the watcher is asked once more before the error propagates,
        so a request broken by a dying server reports the unit's state and journal rather
        than just "connection reset".
        """
        box: Dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed over to the caller
                box["error"] = exc

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.05)
            self.check()
        if "error" in box:
            if not isinstance(self.watcher, NullWatcher):
                self.poll_now()
                self.check()
            raise box["error"]
        return box.get("value")


def make_watcher(cfg: Dict[str, Any]) -> Any:
    """The watcher the options ask for."""
    if cfg.get("unit"):
        return UnitWatcher(cfg["unit"], cfg["journal_max_lines"], cfg["journal_max_bytes"], cfg["allow_prior_restarts"])
    if cfg.get("pid"):
        return PidWatcher(cfg["pid"], cfg.get("log_file"), cfg["journal_max_lines"], cfg["journal_max_bytes"])
    return NullWatcher()


# --------------------------------------------------------------------------------------
# Readiness
# --------------------------------------------------------------------------------------

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
    "speculative": "reading the accept length",
}


def probe_health(endpoint: Endpoint, timeout: float) -> Tuple[str, str]:
    """One ``GET /health``: (state, detail) with state in :data:`STATE_TEXT`."""
    try:
        status, body = endpoint.request("GET", HEALTH_PATH, timeout=timeout)
    except ConnectionRefusedError:
        return "loading", "connection refused"
    except socket.gaierror as exc:
        raise GateFailure("wait", "cannot resolve the server's host %s: %s" % (endpoint.host, exc))
    except (socket.timeout, TimeoutError):
        return "unresponsive", "no answer within %.0f s" % timeout
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        return "loading", "%s: %s" % (type(exc).__name__, exc)
    if status == 200:
        return "ready", "HTTP 200"
    if status == 503:
        return "warming", "HTTP 503: %s" % quote_body(body, 300)
    return "http_error", "HTTP %d: %s" % (status, quote_body(body, 300))


def wait_ready(
    endpoint: Endpoint,
    cfg: Dict[str, Any],
    monitor: Monitor,
    progress: Callable[[str], None],
    record: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Poll ``/health`` until 200 or the deadline; return the readiness record.

    ``record`` (filled as the wait goes on, so it is complete even when the wait fails)
    holds the states seen and when. The deadline message names the state the server
    was stuck in and for how long ("warming up (HTTP 503 from /health) for 1790 s").
    """
    start = time.monotonic()
    deadline = start + cfg["ready_timeout_s"]
    record = record if record is not None else {}
    phases: List[Dict[str, Any]] = []
    record.update({"ready_after_s": None, "polls": 0, "phases": phases})
    state, detail, since = "", "", start
    polls = 0
    while True:
        monitor.phase = state or "wait"
        monitor.check()
        remaining = deadline - time.monotonic()
        new_state, detail = monitor.call(probe_health, endpoint, max(0.5, min(cfg["health_timeout_s"], remaining)))
        polls += 1
        record["polls"] = polls
        now = time.monotonic()
        if new_state != state:
            state, since = new_state, now
            phases.append({"state": state, "at_s": _r(now - start, 3), "detail": detail})
            progress(STATE_TEXT[state] if state in ("ready", "loading") else "%s: %s" % (STATE_TEXT[state], detail))
        monitor.phase = state
        if state == "ready":
            record["ready_after_s"] = _r(now - start, 3)
            return record
        if now >= deadline:
            raise GateFailure(
                state,
                "server at %s not ready after %.0f s (ready_timeout_s %.0f): %s for %.0f s; "
                "last answer: %s"
                % (endpoint.display, now - start, cfg["ready_timeout_s"], STATE_TEXT[state], now - since, detail),
            )
        monitor.wait(min(cfg["poll_interval_s"], max(deadline - now, 0.05)))


# --------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------

SERVER_INFO_KEYS = (
    "version",
    "model_path",
    "served_model_name",
    "tp_size",
    "dp_size",
    "dtype",
    "context_length",
    "max_running_requests",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "mamba_scheduler_strategy",
    "attention_backend",
    "disable_radix_cache",
    "enable_metrics",
)


def get_server_info(endpoint: Endpoint, timeout: float) -> Optional[Dict[str, Any]]:
    """SGLang's ``/server_info`` (or the deprecated ``/get_server_info``); None elsewhere."""
    for path in SERVER_INFO_PATHS:
        try:
            status, data = endpoint.get_json(path, timeout)
        except (OSError, http.client.HTTPException):
            return None
        if status == 200 and isinstance(data, dict):
            return data
    return None


def accept_length_from_info(info: Optional[Dict[str, Any]]) -> Optional[float]:
    """``internal_states[0].avg_spec_accept_length`` when present (after 40 decode steps)."""
    if not info:
        return None
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def list_models(endpoint: Endpoint, timeout: float) -> Tuple[List[str], str]:
    """Ids from ``/v1/models`` and a note when that fails."""
    try:
        status, data = endpoint.get_json("/v1/models", timeout)
    except (OSError, http.client.HTTPException) as exc:
        return [], "/v1/models failed: %s" % exc
    if status != 200 or not isinstance(data, dict):
        return [], "/v1/models answered HTTP %d" % status
    ids = [str(m.get("id")) for m in data.get("data") or [] if isinstance(m, dict) and m.get("id")]
    return ids, "" if ids else "/v1/models lists no model"


def resolve_model(listed: List[str], explicit: Optional[str]) -> Tuple[Optional[str], str]:
    """Pick the model id to send.

    The first id of ``/v1/models``, unless the explicit option is one of the listed ids;
    the explicit option when the server lists nothing (``transformers serve``).
    """
    if listed:
        if explicit and explicit in listed:
            return explicit, ""
        note = "" if not explicit else "model %r is not listed by /v1/models; using %r" % (explicit, listed[0])
        return listed[0], note
    if explicit:
        return explicit, ""
    return None, ""


# --------------------------------------------------------------------------------------
# One streaming request
# --------------------------------------------------------------------------------------


class RequestResult(object):
    """Timings and token counts of one streamed chat completion."""

    def __init__(self, index: int, prompt_id: str) -> None:
        self.index = index
        self.prompt_id = prompt_id
        self.started_s = 0.0
        self.ttft_s = 0.0
        self.e2e_s = 0.0
        self.decode_s = 0.0
        self.decode_tps: Optional[float] = None
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.content_chunks = 0
        self.finish_reason: Optional[str] = None
        self.gaps: List[float] = []

    def as_dict(self) -> Dict[str, Any]:
        """Per-request figures for the report."""
        return {
            "index": self.index,
            "prompt_id": self.prompt_id,
            "started_s": _r(self.started_s, 3),
            "ttft_s": _r(self.ttft_s),
            "decode_s": _r(self.decode_s),
            "decode_tps": _r(self.decode_tps, 3),
            "itl_mean_s": _r(_mean(self.gaps), 5),
            "itl_p95_s": _r(percentile(self.gaps, 95), 5),
            "e2e_s": _r(self.e2e_s),
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "content_chunks": self.content_chunks,
            "finish_reason": self.finish_reason,
        }


def _has_token(delta: Dict[str, Any]) -> bool:
    for key in ("content", "reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str) and delta.get(key):
            return True
    return bool(delta.get("tool_calls"))


def stream_chat(
    endpoint: Endpoint,
    model: str,
    prompt: Dict[str, Any],
    max_tokens: int,
    timeout_s: float,
    index: int = 0,
    t_zero: Optional[float] = None,
    register: Optional[Callable[[http.client.HTTPConnection], None]] = None,
) -> RequestResult:
    """Send one streaming chat completion and time it; raise :class:`RequestError`.

    ``timeout_s`` bounds both silence on the socket (a stalled stream) and the whole
    request. A stream that ends without ``finish_reason``/``[DONE]`` was dropped; one
    without ``usage`` cannot be measured (the gate never counts chunks as tokens).
    """
    result = RequestResult(index, prompt["id"])
    payload = {
        "model": model,
        "messages": prompt["messages"],
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    conn = endpoint.connect(timeout_s)
    if register:
        register(conn)
    token_times: List[float] = []
    usage: Optional[Dict[str, Any]] = None
    done = False
    what = "request %d (%s)" % (index, prompt["id"])
    t0 = time.monotonic()
    result.started_s = t0 - (t_zero if t_zero is not None else t0)
    try:
        conn.request(
            "POST",
            endpoint.prefix + CHAT_PATH,
            body=json.dumps(payload).encode("utf-8"),
            headers=endpoint.headers({"Content-Type": "application/json", "Accept": "text/event-stream"}),
        )
        response = conn.getresponse()
        if response.status != 200:
            raise RequestError(
                "%s: HTTP %d %s from POST %s: %s"
                % (what, response.status, response.reason, CHAT_PATH, quote_body(response.read()))
            )
        while True:
            raw = response.readline()
            now = time.monotonic()
            if not raw:
                break
            if now - t0 > timeout_s:
                raise RequestError(
                    "%s took longer than request_timeout_s (%.0f s) after %d content chunks"
                    % (what, timeout_s, len(token_times))
                )
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" lines
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data.decode("utf-8"))
            except ValueError:
                raise RequestError("%s: unparseable stream line: %s" % (what, quote_body(data, 300)))
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):
                raise RequestError(
                    "%s: the server reported an error in the stream: %s"
                    % (what, json.dumps(chunk["error"])[:BODY_QUOTE_CHARS])
                )
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                if _has_token(choice.get("delta") or {}):
                    token_times.append(now)
                if choice.get("finish_reason"):
                    result.finish_reason = str(choice["finish_reason"])
        t_end = time.monotonic()
    except (socket.timeout, TimeoutError):
        raise RequestError(
            "%s stalled: no data for %.0f s (request_timeout_s) after %d content chunks"
            % (what, timeout_s, len(token_times))
        )
    except ConnectionRefusedError as exc:
        raise RequestError("%s: connection refused (%s)" % (what, exc))
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError) as exc:
        raise RequestError(
            "%s: stream dropped after %d content chunks (%s: %s)" % (what, len(token_times), type(exc).__name__, exc)
        )
    except (http.client.HTTPException, OSError) as exc:
        raise RequestError("%s failed: %s: %s" % (what, type(exc).__name__, exc))
    finally:
        conn.close()
    if not done and result.finish_reason is None:
        raise RequestError(
            "%s: stream dropped: it ended after %d content chunks without a "
            "finish_reason or [DONE]" % (what, len(token_times))
        )
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        raise RequestError(
            "%s: the server sent no usage.completion_tokens in the stream; the gate counts "
            "tokens from the server's usage, never from chunks (SGLang and vLLM send it "
            "with stream_options.include_usage)" % what
        )
    if not token_times:
        raise RequestError(
            "%s: the stream carried no content (usage says %s completion tokens)"
            % (what, usage.get("completion_tokens"))
        )
    result.completion_tokens = int(usage["completion_tokens"])
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.content_chunks = len(token_times)
    result.ttft_s = token_times[0] - t0
    result.e2e_s = t_end - t0
    result.decode_s = token_times[-1] - token_times[0]
    result.decode_tps = decode_tps(result.completion_tokens, token_times[0], token_times[-1])
    result.gaps = [b - a for a, b in zip(token_times, token_times[1:])]
    return result


def run_requests(
    endpoint: Endpoint,
    model: str,
    prompts: List[Dict[str, Any]],
    count: int,
    concurrency: int,
    max_tokens: int,
    timeout_s: float,
    monitor: Monitor,
    first_index: int = 0,
) -> Tuple[List[RequestResult], float]:
    """Run ``count`` requests, ``concurrency`` at a time; (results in order, wall seconds).

    The first failed request stops the run; the watcher is asked first, so a server that
    died is reported as such.
    """
    jobs: "queue.Queue[int]" = queue.Queue()
    for i in range(count):
        jobs.put(i)
    results: Dict[int, RequestResult] = {}
    errors: List[BaseException] = []
    conns: List[http.client.HTTPConnection] = []
    lock = threading.Lock()
    t_zero = time.monotonic()

    def register(conn: http.client.HTTPConnection) -> None:
        with lock:
            conns.append(conn)

    def worker() -> None:
        while not errors:
            try:
                i = jobs.get_nowait()
            except queue.Empty:
                return
            prompt = prompts[(first_index + i) % len(prompts)]
            try:
                res = stream_chat(endpoint, model, prompt, max_tokens, timeout_s, first_index + i, t_zero, register)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                with lock:
                    errors.append(exc)
                return
            with lock:
                results[i] = res

    threads = [
        threading.Thread(target=worker, name="health-gate-req-%d" % n, daemon=True)
        for n in range(max(1, min(concurrency, count)))
    ]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            monitor.wait(0.05)
            if errors:
                break
        if errors:
            monitor.poll_now()
            monitor.check()
            raise errors[0]
    finally:
        if errors or monitor.failure is not None:
            with lock:
                for conn in conns:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - best effort
                        pass
    wall = time.monotonic() - t_zero
    return [results[i] for i in sorted(results)], wall


def generate_accept_length(
    endpoint: Endpoint, prompt: Dict[str, Any], max_tokens: int, timeout_s: float
) -> Tuple[Optional[float], str]:
    """``meta_info.spec_accept_length`` of one ``/generate`` call (SGLang's native API)."""
    text = "\n\n".join(m["content"] for m in prompt["messages"])
    payload = {"text": text, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
    try:
        status, body = endpoint.request("POST", "/generate", payload=payload, timeout=timeout_s)
    except (OSError, http.client.HTTPException) as exc:
        return None, "/generate failed: %s" % exc
    if status != 200:
        return None, "/generate answered HTTP %d: %s" % (status, quote_body(body, 300))
    try:
        data = json.loads(body.decode("utf-8"))
    except ValueError:
        return None, "/generate answered no JSON"
    if isinstance(data, list) and data:
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, dict) else None
    value = meta.get("spec_accept_length") if isinstance(meta, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), ""
    return None, "/generate meta_info has no spec_accept_length"


# --------------------------------------------------------------------------------------
# Verdict, summary, report
# --------------------------------------------------------------------------------------


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return "n/a" if value is None else ("%.*f" % (digits, value))


def _limit(value: float, digits: int = 1) -> str:
    return "off" if not value else ("%g" % round(value, digits + 1))


def evaluate(
    agg: Dict[str, Any], accept: Dict[str, Any], cfg: Dict[str, Any]
) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Compare the aggregate with the thresholds; (checks, failure reasons)."""
    checks: List[Dict[str, Any]] = []
    reasons: List[str] = []
    tps = agg.get("decode_tps_mean")
    if cfg["min_decode_tps"] > 0:
        ok = tps is not None and tps >= cfg["min_decode_tps"]
        checks.append(
            {
                "name": "decode_tps",
                "statistic": "mean",
                "value": tps,
                "op": ">=",
                "limit": cfg["min_decode_tps"],
                "ok": ok,
            }
        )
        if tps is None:
            reasons.append("no request produced two or more tokens in separate chunks: decode speed unknown")
        elif not ok:
            reasons.append("decode %.1f tok/s is below min_decode_tps %g" % (tps, cfg["min_decode_tps"]))
    ttft = agg.get("ttft_p95_s")
    if cfg["max_ttft_s"] > 0:
        ok = ttft is not None and ttft <= cfg["max_ttft_s"]
        checks.append(
            {
                "name": "ttft",
                "statistic": TTFT_STATISTIC,
                "value": ttft,
                "op": "<=",
                "limit": cfg["max_ttft_s"],
                "ok": ok,
            }
        )
        if not ok:
            reasons.append("TTFT %s %s s is above max_ttft_s %g" % (TTFT_STATISTIC, _fmt(ttft, 2), cfg["max_ttft_s"]))
    value = accept.get("value")
    if cfg["min_accept_length"] > 0:
        if value is None:
            checks.append(
                {
                    "name": "accept_length",
                    "value": None,
                    "op": ">=",
                    "limit": cfg["min_accept_length"],
                    "ok": None,
                    "note": "not applied: " + (accept.get("note") or "the engine reports none"),
                }
            )
        else:
            ok = value >= cfg["min_accept_length"]
            checks.append(
                {
                    "name": "accept_length",
                    "value": value,
                    "op": ">=",
                    "limit": cfg["min_accept_length"],
                    "ok": ok,
                    "source": accept.get("source"),
                }
            )
            if not ok:
                reasons.append(
                    "MTP accept length %.2f is below min_accept_length %g" % (value, cfg["min_accept_length"])
                )
    return checks, reasons


# The figures a baseline (the last-known-good's gate) carries, and whether lower is worse.
BASELINE_FIGURES = {"decode_tps_mean": True, "ttft_p95_s": False, "accept_length": True}
# What must be equal for two gates to be compared: the same measurement on the same prompts.
BASELINE_SETTINGS = ("requests", "concurrency", "max_tokens", "prompts")


def baseline_of(report: Dict[str, Any]) -> Dict[str, Any]:
    """What a passing report leaves for the next deploy's relative gate (last-known-good)."""
    agg = report.get("aggregate") or {}
    settings = report.get("settings") or {}
    return {
        "unit_sha256": (report.get("metadata") or {}).get("unit_sha256"),
        "decode_tps_mean": agg.get("decode_tps_mean"),
        "ttft_p95_s": agg.get("ttft_p95_s"),
        "accept_length": (report.get("speculative") or {}).get("accept_length"),
        "timestamp": report.get("timestamp"),
        **{key: settings.get(key) for key in BASELINE_SETTINGS},
    }


def compare_baseline(
    agg: Dict[str, Any], accept: Dict[str, Any], cfg: Dict[str, Any]
) -> Tuple[List[Dict[str, Any]], List[str], Optional[str]]:
    """The relative gate: (checks, failure reasons, note) against ``cfg["baseline"]``.

    Compared only when there is a baseline, ``max_regression_pct`` is above 0, the unit is
    not the baseline's own (same unit sha256: nothing changed, so nothing to compare) and
    the measurement is the same (requests, concurrency, max_tokens, prompts). A figure fails
    when it is worse than the baseline's by more than ``max_regression_pct`` percent; TTFT
    also needs to be worse by more than ``regression_min_ttft_delta_s`` seconds (a few tens
    of milliseconds of jitter are most of a small TTFT).
    """
    baseline = cfg.get("baseline") or {}
    pct = float(cfg.get("max_regression_pct") or 0)
    if not baseline or pct <= 0:
        return [], [], None
    unit = (cfg.get("metadata") or {}).get("unit_sha256")
    if unit and baseline.get("unit_sha256") == unit:
        return [], [], "not compared with the last-known-good: the unit is the last-known-good one"
    ours = {"requests": cfg["requests"], "concurrency": cfg["concurrency"], "max_tokens": cfg["max_tokens"],
            "prompts": [p["id"] for p in cfg["prompts"]]}
    differs = [key for key in BASELINE_SETTINGS if baseline.get(key) is not None and baseline.get(key) != ours[key]]
    if differs:
        return [], [], ("not compared with the last-known-good: it was measured with another %s"
                        % ", ".join(differs))
    current = {"decode_tps_mean": agg.get("decode_tps_mean"), "ttft_p95_s": agg.get("ttft_p95_s"),
               "accept_length": accept.get("value")}
    labels = {"decode_tps_mean": ("decode", " tok/s", 1), "ttft_p95_s": ("TTFT %s" % TTFT_STATISTIC, " s", 2),
              "accept_length": ("accept length", "", 2)}
    checks: List[Dict[str, Any]] = []
    reasons: List[str] = []
    for key, lower_is_worse in BASELINE_FIGURES.items():
        base, value = baseline.get(key), current[key]
        if base is None or value is None or base <= 0:
            continue
        change = 100.0 * (value - base) / base
        worse = -change if lower_is_worse else change
        limit = base * (1 - pct / 100.0) if lower_is_worse else base * (1 + pct / 100.0)
        ok = worse <= pct
        if key == "ttft_p95_s" and not ok and value - base <= float(cfg.get("regression_min_ttft_delta_s") or 0):
            ok = True
        checks.append({"name": key.replace("_mean", "").replace("_p95_s", "") + "_vs_last_known_good",
                       "value": value, "baseline": base, "change_pct": round(change, 2),
                       "op": ">=" if lower_is_worse else "<=", "limit": round(limit, 4), "ok": ok})
        if not ok:
            what, unit_label, digits = labels[key]
            reasons.append("%s %s%s is %.1f %% %s the last-known-good's %s%s (max_regression_pct %g)" % (
                what, _fmt(value, digits), unit_label, abs(change), "below" if lower_is_worse else "above",
                _fmt(base, digits), unit_label, pct))
    return checks, reasons, None


def summary_line(report: Dict[str, Any]) -> str:
    """One line for the play output, e.g.
    ``gate PASS: 52.3 tok/s decode (min 40), TTFT p95 0.41 s (max 3), accept 2.10 (min 1.5), 8 requests``.
    """
    verdict = "PASS" if report.get("passed") else "FAIL"
    agg = report.get("aggregate")
    th = report.get("thresholds") or {}
    if not agg:
        return "gate %s (%s): %s" % (verdict, report.get("phase"), "; ".join(report.get("reasons") or []))
    parts = [
        "%s tok/s decode (min %s)" % (_fmt(agg.get("decode_tps_mean")), _limit(th.get("min_decode_tps", 0))),
        "TTFT %s %s s (max %s)" % (TTFT_STATISTIC, _fmt(agg.get("ttft_p95_s"), 2), _limit(th.get("max_ttft_s", 0))),
    ]
    accept = (report.get("speculative") or {}).get("accept_length")
    if accept is not None or th.get("min_accept_length"):
        parts.append("accept %s (min %s)" % (_fmt(accept, 2), _limit(th.get("min_accept_length", 0))))
    relative = [c for c in report.get("checks") or [] if c["name"].endswith("_vs_last_known_good")]
    if relative:
        parts.append("vs last-known-good %s" % ", ".join(
            "%s %+.1f %%" % (c["name"].split("_vs_")[0], c["change_pct"]) for c in relative))
    line = "gate %s: %s, %d requests" % (verdict, ", ".join(parts), agg.get("requests", 0))
    if not report.get("passed"):
        line += " - " + "; ".join(report.get("reasons") or [])
    return line


def failure_message(report: Dict[str, Any]) -> str:
    """Summary plus evidence (unit state and the journal of this start) for a failed gate."""
    lines = [report.get("summary") or summary_line(report)]
    evidence = report.get("evidence") or {}
    if evidence.get("exception"):
        lines.append("exception: %s" % evidence["exception"])
    if evidence.get("log_source"):
        cap = (", capped to the last %d lines" % evidence.get("log_lines", 0)) if evidence.get("log_capped") else ""
        lines.append("--- %s (%d lines%s) ---" % (evidence["log_source"], evidence.get("log_lines", 0), cap))
        lines.append(evidence.get("log") or "(empty)")
        lines.append("--- end of log ---")
    return "\n".join(lines)


def utc_now() -> datetime.datetime:
    """Current UTC time (timezone aware)."""
    return datetime.datetime.now(datetime.timezone.utc)


def _public_settings(cfg: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "warmup_requests": cfg["warmup_requests"],
        "requests": cfg["requests"],
        "concurrency": cfg["concurrency"],
        "max_tokens": cfg["max_tokens"],
        "temperature": 0,
        "request_timeout_s": cfg["request_timeout_s"],
        "ready_timeout_s": cfg["ready_timeout_s"],
        "poll_interval_s": cfg["poll_interval_s"],
        "prompts": [p["id"] for p in cfg["prompts"]],
        "api_key_set": bool(cfg.get("api_key")),
    }


def run_gate(options: Dict[str, Any], progress: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Run the whole gate and return the report (``report["passed"]`` is the verdict).

    Raises :class:`GateUsageError` (before touching the server) for bad options only.
    """
    cfg = validate_config(make_config(options))
    t_start = time.monotonic()
    started = utc_now()

    def say(message: str) -> None:
        if progress:
            progress("[%7.1f s] %s" % (time.monotonic() - t_start, message))

    endpoint = Endpoint(cfg["url"], cfg.get("api_key"))
    watcher = make_watcher(cfg)
    monitor = Monitor(watcher, max(0.2, min(cfg["poll_interval_s"] / 2.0, 1.0)))
    report: Dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "tool": "health_gate",
        "timestamp": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "url": endpoint.display,
        "engine": cfg["engine"] if cfg["engine"] != "auto" else None,
        "version": None,
        "model": None,
        "watch": (
            {"unit": watcher.unit}
            if isinstance(watcher, UnitWatcher)
            else ({"pid": watcher.pid} if isinstance(watcher, PidWatcher) else None)
        ),
        "settings": _public_settings(cfg),
        "thresholds": {
            "min_decode_tps": cfg["min_decode_tps"],
            "max_ttft_s": cfg["max_ttft_s"],
            "ttft_statistic": TTFT_STATISTIC,
            "min_accept_length": cfg["min_accept_length"],
            "decode_statistic": "mean",
            "max_regression_pct": cfg["max_regression_pct"],
        },
        "readiness": None,
        "server": None,
        "warmup": None,
        "requests": [],
        "aggregate": None,
        "speculative": None,
        "checks": [],
        "notes": [],
        "passed": False,
        "phase": "wait",
        "reasons": [],
        "evidence": None,
        "metadata": cfg["metadata"],
    }
    try:
        if not isinstance(watcher, NullWatcher):
            say("watching %s" % (report["watch"]))
        report["readiness"] = {}
        monitor.start()
        wait_ready(endpoint, cfg, monitor, say, report["readiness"])

        report["phase"] = monitor.phase = "discover"
        timeout = cfg["health_timeout_s"]
        info = monitor.call(get_server_info, endpoint, timeout)
        engine = cfg["engine"]
        if engine == "auto":
            engine = "sglang" if info else "generic"
        report["engine"] = engine
        if info:
            report["version"] = info.get("version")
            report["server"] = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
        elif engine == "sglang":
            report["notes"].append("engine is sglang but /server_info and /get_server_info did not answer")
        listed, note = monitor.call(list_models, endpoint, timeout)
        if note in ("/v1/models answered HTTP 401", "/v1/models answered HTTP 403"):
            raise GateFailure(
                "discover",
                "the server refused /v1/models with HTTP %s %s: set health_gate_api_key (it defaults to "
                "inference_server_api_key) to the server's API key"
                % (note[-3:], "with the API key the gate sent" if cfg.get("api_key") else "without an API key"),
            )
        if note:
            report["notes"].append(note)
        model, note = resolve_model(listed, cfg.get("model"))
        if note:
            report["notes"].append(note)
        if not model:
            raise GateFailure(
                "discover",
                "the server lists no model at /v1/models; set the model option "
                "(transformers serve needs the model directory it was started with)",
            )
        report["model"] = model
        say("engine %s%s, model %s" % (engine, (" " + str(report["version"])) if report["version"] else "", model))

        if cfg["warmup_requests"]:
            report["phase"] = monitor.phase = "warmup"
            warm, warm_wall = run_requests(
                endpoint,
                model,
                cfg["prompts"],
                cfg["warmup_requests"],
                min(cfg["concurrency"], cfg["warmup_requests"]),
                cfg["max_tokens"],
                cfg["request_timeout_s"],
                monitor,
                first_index=0,
            )
            report["warmup"] = {
                "requests": len(warm),
                "wall_s": _r(warm_wall, 3),
                "ttft_s": [_r(r.ttft_s) for r in warm],
            }
            say("warm-up: %d requests in %.1f s" % (len(warm), warm_wall))

        report["phase"] = monitor.phase = "measure"
        say(
            "measuring: %d requests, concurrency %d, max_tokens %d"
            % (cfg["requests"], cfg["concurrency"], cfg["max_tokens"])
        )
        results, wall = run_requests(
            endpoint,
            model,
            cfg["prompts"],
            cfg["requests"],
            cfg["concurrency"],
            cfg["max_tokens"],
            cfg["request_timeout_s"],
            monitor,
            first_index=cfg["warmup_requests"],
        )
        report["requests"] = [r.as_dict() for r in results]
        agg = aggregate(results, wall)
        report["aggregate"] = agg
        short = [r.index for r in results if r.decode_tps is None]
        if short:
            report["notes"].append("requests %s produced fewer than 2 tokens (or one chunk): no decode speed" % short)

        report["phase"] = monitor.phase = "speculative"
        accept: Dict[str, Any] = {"value": None, "source": None, "note": None}
        if engine == "sglang":
            info_after = monitor.call(get_server_info, endpoint, timeout)
            spec_algo = (info_after or info or {}).get("speculative_algorithm")
            accept["algorithm"] = spec_algo
            if not spec_algo:
                accept["note"] = "speculative decoding is off"
            else:
                value = accept_length_from_info(info_after)
                accept["server_info"] = value
                if value is not None:
                    accept.update(value=_r(value, 3), source="server_info.internal_states[0].avg_spec_accept_length")
                else:
                    gen, note = monitor.call(
                        generate_accept_length, endpoint, cfg["prompts"][0], cfg["max_tokens"], cfg["request_timeout_s"]
                    )
                    accept["generate"] = gen
                    if gen is not None:
                        accept.update(value=_r(gen, 3), source="/generate meta_info.spec_accept_length")
                    else:
                        accept["note"] = "no accept length: server_info has none yet; " + note
            if isinstance((info_after or {}).get("internal_states"), list) and info_after["internal_states"]:
                state0 = info_after["internal_states"][0]
                if isinstance(state0, dict) and "last_gen_throughput" in state0:
                    accept["last_gen_throughput"] = state0.get("last_gen_throughput")
        else:
            accept["note"] = "engine %s reports no accept length" % engine
        report["speculative"] = {
            "accept_length": accept["value"],
            "source": accept["source"],
            "detail": {k: v for k, v in accept.items() if k not in ("value", "source")},
        }

        monitor.poll_now()
        monitor.check()
        report["phase"] = "evaluate"
        report["checks"], report["reasons"] = evaluate(agg, accept, cfg)
        relative, worse, note = compare_baseline(agg, accept, cfg)
        report["checks"] += relative
        report["reasons"] += worse
        if cfg.get("baseline"):
            report["baseline"] = dict(cfg["baseline"], compared=bool(relative), note=note)
        if note:
            report["notes"].append(note)
        report["passed"] = not report["reasons"]
        report["phase"] = "done"
    except GateFailure as exc:
        report["passed"] = False
        report["phase"] = exc.phase
        reason = exc.reason
        if exc.watch is not None:
            reason += ", %.1f s into the gate while %s" % (
                time.monotonic() - t_start,
                PHASE_TEXT.get(exc.phase, exc.phase),
            )
            if exc.watch.exception:
                reason += ": " + exc.watch.exception
            report["evidence"] = exc.watch.as_dict()
        report["reasons"] = [reason]
        if exc.detail:
            report["failure_detail"] = exc.detail
    except RequestError as exc:
        report["passed"] = False
        report["reasons"] = [str(exc)]
    finally:
        monitor.stop()
        report["unit"] = watcher.describe() if not isinstance(watcher, NullWatcher) else None
        report["duration_s"] = _r(time.monotonic() - t_start, 3)
    report["summary"] = summary_line(report)
    say(report["summary"])
    return redact(report, [cfg.get("api_key") or ""])


# --------------------------------------------------------------------------------------
# Report storage
# --------------------------------------------------------------------------------------


def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def store_report(report: Dict[str, Any], report_dir: str, keep: int) -> str:
    """Write ``<UTC timestamp>.json`` and ``latest.json`` in ``report_dir``; prune the history.

    Keeps the newest ``keep`` timestamped reports; returns the new report's path.
    Failed gates are stored too, so a failed attempt stays on record.
    """
    os.makedirs(report_dir, mode=0o755, exist_ok=True)
    stamp = str(report.get("timestamp") or utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"))
    base = stamp.replace("-", "").replace(":", "")
    name = base + ".json"
    n = 0
    while os.path.exists(os.path.join(report_dir, name)):
        n += 1
        name = "%s-%d.json" % (base, n)
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    path = os.path.join(report_dir, name)
    _atomic_write(path, text)
    _atomic_write(os.path.join(report_dir, "latest.json"), text)
    history = sorted((f for f in os.listdir(report_dir) if REPORT_NAME_RE.match(f)), key=_report_sort_key)
    for old in history[:-keep] if len(history) > keep else []:
        try:
            os.unlink(os.path.join(report_dir, old))
        except OSError:
            pass
    return path


def _report_sort_key(name: str) -> Tuple[str, int]:
    stem = name[:-5]
    if "-" in stem:
        base, n = stem.split("-", 1)
        return base, int(n)
    return stem, 0
