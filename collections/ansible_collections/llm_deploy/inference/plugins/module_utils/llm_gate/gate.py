# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The gate run: readiness, discovery, warm-up, measurement, accept length and capacity, verdict, one report."""

from __future__ import annotations

import dataclasses
import http.client
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from . import discovery
from .client import Endpoint, tls_context
from .config import SCHEMA_VERSION, GateConfig
from .correctness import reference_of, wanted
from .errors import GateFailure, GateUsageError, RequestError
from .listener import make_guard
from .monitor import Monitor
from .probe import run_probe
from .probeset import probe_identity
from .readiness import PHASE_TEXT, wait_ready
from .redaction import redact
from .report import TIMESTAMP_FORMAT, utc_now
from .stats import aggregate, rounded
from .streaming import fixed_output_fields, run_requests
from .verdict import judge, summary_line, verdict_of
from .watchers import NullWatcher, PidWatcher, UnitWatcher, make_watcher


def _new_report(
    cfg: GateConfig, endpoint: Endpoint, public: Endpoint | None, watcher: Any, stamp: str
) -> dict[str, Any]:
    """The report before anything is known: settings, thresholds and empty results."""
    return {
        "schema": SCHEMA_VERSION,
        "tool": "health_gate",
        "timestamp": stamp,
        "host": socket.gethostname(),
        "url": endpoint.display,
        # The account every listener on the port must belong to (llm_gate/listener.py); None: not checked.
        "listener_user": endpoint.guard.user if endpoint.guard else None,
        "engine": cfg.engine if cfg.engine != "auto" else None,
        "version": None,
        "model": None,
        "watch": (
            {"unit": watcher.unit}
            if isinstance(watcher, UnitWatcher)
            else ({"pid": watcher.pid} if isinstance(watcher, PidWatcher) else None)
        ),
        "settings": cfg.settings(),
        "thresholds": cfg.thresholds(),
        "readiness": None,
        "server": None,
        "warmup": None,
        "requests": [],
        "aggregate": None,
        "speculative": None,
        "capacity": None,
        # Where the API key reads the admin key (llm_gate/discovery.keys_readable); None: not asked. With
        # public_url, the API front's routes (any of them fails the gate), else the server's (a note).
        "keys_readable": None,
        # The API front's public bind asked instead of the server's routes (_public_keys); None: not set.
        "public_url": public.display if public else None,
        # TLS: the CA file and the name an https URL's certificate was verified with (None: plain HTTP).
        "tls": (
            {"ca_file": cfg.ca_file or None, "server_name": cfg.tls_server_name or None}
            if "https" in (endpoint.scheme, public.scheme if public else "")
            else None
        ),
        "correctness": None,
        "correctness_why": None,
        "checks": [],
        "notes": [],
        "passed": False,
        "phase": "wait",
        "reasons": [],
        "verdict": None,
        "evidence": None,
        "metadata": cfg.metadata,
    }


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every step of one gate run works with: the server, the checked options, the monitor that
    watches the unit, the report being filled in, and the progress line."""

    endpoint: Endpoint
    cfg: GateConfig
    monitor: Monitor
    report: dict[str, Any]
    say: Callable[[str], None]
    # The API front's public bind (the ``public_url`` option, :func:`_public_endpoint`); None without one.
    public: Endpoint | None = None

    def enter(self, phase: str) -> None:
        """Start ``phase``: the report and the monitor (which names it in a failure's reason) both say so."""
        self.report["phase"] = self.monitor.phase = phase


def _discover(run: _Run) -> tuple[str, dict[str, Any] | None, str]:
    """Engine, ``/server_info`` and the model id to send, noted in the report; (engine, info, model)."""
    endpoint, cfg, monitor, report = run.endpoint, run.cfg, run.monitor, run.report
    run.enter("discover")
    timeout = cfg.health_timeout_s
    info = monitor.call(discovery.get_server_info, endpoint, timeout)
    engine = cfg.engine
    if engine == "auto":
        engine = "sglang" if info else "generic"
    report["engine"] = engine
    if info:
        report["version"] = info.get("version")
        report["server"] = {k: info.get(k) for k in discovery.SERVER_INFO_KEYS if k in info}
    elif engine == "sglang":
        report["notes"].append("engine is sglang but /server_info and /get_server_info did not answer")
    if run.public is not None:
        monitor.call(_public_answers, run.public, cfg, timeout)
    if cfg.admin_api_key and cfg.admin_api_key != cfg.api_key:
        keys = {"the admin key": cfg.admin_api_key}
        if run.public is not None:
            _public_keys(run, run.public, keys)
        else:
            readable = monitor.call(discovery.keys_readable, endpoint, timeout, keys)
            report["keys_readable"] = readable
            if readable:
                report["notes"].append(discovery.keys_readable_note(readable))
    listed, note = monitor.call(discovery.list_models, endpoint, timeout)
    if note in ("/v1/models answered HTTP 401", "/v1/models answered HTTP 403"):
        sent = "with the API key the gate sent" if cfg.api_key else "without an API key"
        raise GateFailure(
            "discover",
            f"the server refused /v1/models with HTTP {note[-3:]} {sent}: set health_gate_api_key (it defaults to "
            "inference_server_api_key) to the server's API key",
        )
    if note:
        report["notes"].append(note)
    model, note = discovery.resolve_model(listed, cfg.model)
    if note:
        report["notes"].append(note)
    if not model:
        raise GateFailure(
            "discover",
            "the server lists no model at /v1/models; set the model option "
            "(transformers serve needs the model directory it was started with)",
        )
    report["model"] = model
    return engine, info, model


def _public_answers(public: Endpoint, cfg: GateConfig, timeout: float) -> None:
    """The API front's public bind answers ``/health`` as a client reaches it, its certificate verified (https).

    A front that is down, a certificate the gate's CA (``ca_file``) does not verify or that is not issued to the
    server name clients ask for: :class:`GateFailure` naming the URL, before any route of the front is judged.
    """
    try:
        status, _ = public.request("GET", "/health", timeout=timeout)
    except GateFailure as exc:  # the listener guard refused the port's holder
        if exc.watch is not None:
            raise
        raise GateFailure("discover", f"at the public URL {public.display}, {exc.reason}") from exc
    except ssl.SSLCertVerificationError as exc:
        raise GateFailure(
            "discover",
            f"the public URL {public.display} presents a certificate that clients refuse: {exc.verify_message} "
            f"(verified with {cfg.ca_file or 'the system CAs'} for {cfg.tls_server_name or public.host}); "
            "install the certificate the CA issued for that name (docs/security.md, TLS)",
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise GateFailure(
            "discover",
            f"the public URL {public.display} does not answer /health ({exc}): clients cannot reach the "
            "server there (is the API front running, and is it the scheme the front serves?)",
        ) from None
    if status != 200:
        raise GateFailure("discover", f"the public URL {public.display} answered /health with HTTP {status}")


def _public_keys(run: _Run, public: Endpoint, keys: dict[str, str]) -> None:
    """Whether the API front's public bind (``public``) hands one of ``keys`` to the API key: a verdict, not a note.

    The front's ``/server_info`` and ``/get_server_info`` are asked with the API key, as a client
    would (:func:`.discovery.keys_readable`), and what they hand over is ``report["keys_readable"]``;
    any of it raises :class:`GateFailure`. The server's own routes (``url``) are not asked: the
    server listens on loopback behind the front, where SGLang 0.5.11 hands its arguments to the API
    key anyway; what counts is what a client reaches. The front's listener guard refusing a
    listener of another account fails the gate here too, the public URL named.
    """
    report = run.report
    try:
        readable = run.monitor.call(discovery.keys_readable, public, run.cfg.health_timeout_s, keys)
    except GateFailure as exc:
        if exc.watch is not None:  # the server died meanwhile: the watcher's failure as it is
            raise
        raise GateFailure("discover", f"at the public URL {public.display}, {exc.reason}") from exc
    report["keys_readable"] = readable
    if readable:
        routes = " and ".join(entry.partition(" (")[0] for entry in readable)
        raise GateFailure(
            "discover",
            f"the public URL {public.display} hands the admin key to the API key at {routes}: every client "
            "with the API key could use the engine's admin routes (/flush_cache, /update_weights_from_disk, "
            "...); the API front must refuse /server_info and /get_server_info to clients (docs/security.md)",
        )


def _tls(cfg: GateConfig) -> ssl.SSLContext | None:
    """The context that https URLs' certificates are verified with (``ca_file``); None when no URL is https.

    :class:`GateUsageError` (before the gate touches anything) when ``ca_file`` cannot be read.
    """
    if not any(url.startswith("https://") for url in (cfg.url, cfg.public_url)):
        return None
    try:
        return tls_context(cfg.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise GateUsageError(f"ca_file {cfg.ca_file!r} cannot be read as PEM certificates: {exc}") from None


def _public_endpoint(cfg: GateConfig, tls: ssl.SSLContext | None = None) -> Endpoint | None:
    """The API front's public bind (``public_url``) as a client reaches it: the API key, the gate's timeouts
    and a listener guard of its own (``public_listener_user``), made as the server's is, so that no key goes
    to another account's listener there. None without ``public_url``.

    :class:`GateUsageError` (before the gate touches anything) when ``public_listener_user`` is no account.
    """
    if not cfg.public_url:
        return None
    public = Endpoint(cfg.public_url, cfg.api_key, tls=tls, server_name=cfg.tls_server_name)
    try:
        public.guard = make_guard(public.host, public.port, cfg.public_listener_user)
    except ValueError:
        raise GateUsageError(
            f"public_listener_user {cfg.public_listener_user!r} is not an account on this host"
        ) from None
    return public


def _measure(run: _Run, model: str, engine: str) -> dict[str, Any]:
    """Warm-up requests, then the measured ones; the aggregate (also noted in the report).

    Both ask the engine for exactly ``max_tokens`` tokens where it can (:func:`fixed_output_fields`).
    The warm-up is untimed and has the measurement's shapes: the same prompts from the first one on,
    in the same order, at the measured concurrency (at least ``concurrency`` requests, so each batch
    size the measurement reaches has run once) and the same output length; first-request JIT, kernel
    selection for new prompt lengths and the prefix cache are then behind the measurement.
    """
    cfg, report, say = run.cfg, run.report, run.say
    fixed, extra = fixed_output_fields(engine, cfg.max_tokens)

    def measure(count: int) -> tuple[list[Any], float]:
        """``count`` requests from the first prompt on, ``cfg.concurrency`` at a time; (results, wall seconds)."""
        return run_requests(
            run.endpoint, model, cfg.prompts, count, cfg.concurrency, cfg.max_tokens, cfg.request_timeout_s,
            run.monitor, first_index=0, extra=extra,
        )  # fmt: skip

    report["settings"]["fixed_output"] = fixed
    if not fixed:
        report["notes"].append(
            f"engine {engine}: the gate cannot ask for exactly max_tokens tokens, so requests may stop early "
            "at EOS and decode speeds cover different lengths"
        )
    if cfg.requests % cfg.concurrency:
        report["notes"].append(
            f"requests {cfg.requests} is not a multiple of concurrency {cfg.concurrency}: the last "
            f"{cfg.requests % cfg.concurrency} run with fewer requests at once"
        )
    if cfg.warmup_requests:
        run.enter("warmup")
        warm, warm_wall = measure(max(cfg.warmup_requests, cfg.concurrency))
        report["warmup"] = {
            "requests": len(warm),
            "concurrency": cfg.concurrency,
            "wall_s": rounded(warm_wall, 3),
            "ttft_s": [rounded(r.ttft_s) for r in warm],
            "decode_tps": [rounded(r.decode_tps, 3) for r in warm],
        }
        say(f"warm-up: {len(warm)} requests in {warm_wall:.1f} s (not measured)")

    run.enter("measure")
    say(
        f"measuring: {cfg.requests} requests, concurrency {cfg.concurrency}, max_tokens {cfg.max_tokens}"
        + (f" (exactly, {fixed})" if fixed else "")
    )
    results, wall = measure(cfg.requests)
    report["requests"] = [r.as_dict() for r in results]
    agg = aggregate(results, wall)
    report["aggregate"] = agg
    short = [r.index for r in results if r.decode_tps is None]
    if short:
        report["notes"].append(f"requests {short} produced fewer than 2 tokens (or one chunk): no decode speed")
    stopped = [r.index for r in results if fixed and r.completion_tokens < cfg.max_tokens]
    if stopped:
        report["notes"].append(
            f"requests {stopped} stopped before max_tokens although the gate asked for exactly {cfg.max_tokens} "
            f"tokens ({fixed}): the engine ignored it"
        )
    return agg


def _info_after(run: _Run, engine: str) -> dict[str, Any] | None:
    """``/server_info`` once more after the measurement (SGLang only; None elsewhere or when it does not answer).

    Read once: the accept length and the running-request limit both come from it.
    """
    if engine != "sglang":
        return None
    return run.monitor.call(discovery.get_server_info, run.endpoint, run.cfg.health_timeout_s)


def _capacity(engine: str, info: dict[str, Any] | None, info_after: dict[str, Any] | None) -> dict[str, Any]:
    """How many requests the server runs at once, by its scheduler (SGLang): ``capacity_from_info`` of the
    answer after the measurement (the one of discovery when that one failed); a note elsewhere.
    """
    if engine != "sglang":
        return {
            "effective_max_running_requests": None,
            "requested": None,
            "source": None,
            "note": f"engine {engine} reports no running-request limit",
        }
    return discovery.capacity_from_info(info_after or info)


def _speculative(
    run: _Run, engine: str, info: dict[str, Any] | None, info_after: dict[str, Any] | None
) -> dict[str, Any]:
    """The MTP accept length (SGLang): ``{"value", "source", "note", ...}``; ``info_after`` is :func:`_info_after`'s."""
    accept: dict[str, Any] = {"value": None, "source": None, "note": None}
    if engine != "sglang":
        accept["note"] = f"engine {engine} reports no accept length"
        return accept
    spec_algo = (info_after or info or {}).get("speculative_algorithm")
    accept["algorithm"] = spec_algo
    if not spec_algo:
        accept["note"] = "speculative decoding is off"
    else:
        value = discovery.accept_length_from_info(info_after)
        accept["server_info"] = value
        if value is not None:
            accept.update(value=rounded(value, 3), source="server_info.internal_states[0].avg_spec_accept_length")
        else:
            cfg = run.cfg
            gen, note = run.monitor.call(
                discovery.generate_accept_length, run.endpoint, cfg.prompts[0], cfg.max_tokens, cfg.request_timeout_s
            )
            accept["generate"] = gen
            if gen is not None:
                accept.update(value=rounded(gen, 3), source="/generate meta_info.spec_accept_length")
            else:
                accept["note"] = "no accept length: server_info has none yet; " + note
    if isinstance((info_after or {}).get("internal_states"), list) and info_after["internal_states"]:
        state0 = info_after["internal_states"][0]
        if isinstance(state0, dict) and "last_gen_throughput" in state0:
            accept["last_gen_throughput"] = state0.get("last_gen_throughput")
    return accept


def _correctness(run: _Run, engine: str, model: str) -> None:
    """The correctness probe (:mod:`.probe`) when :func:`.correctness.wanted` says so; its results in
    ``report["correctness"]``, why it ran or not in ``report["correctness_why"]``."""
    cfg, report = run.cfg, run.report
    want, why = wanted(cfg)
    report["correctness_why"] = why
    if not want:
        run.say(f"correctness: not asked ({why})")
        return
    run.enter("correctness")
    _, golden, _ = reference_of(cfg)
    try:
        report["correctness"] = run_probe(
            run.endpoint, engine, model, cfg.probe_set, golden, cfg.eval_concurrency, cfg.request_timeout_s,
            run.monitor, cfg.admin_api_key, run.say,
        )  # fmt: skip
    except RequestError as exc:  # judged with the speed figures (llm_gate/correctness.py), not instead of them
        report["correctness"] = {"probe": probe_identity(cfg.probe_set), "engine": engine, "error": str(exc)}


def run_gate(options: dict[str, Any] | GateConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole gate and return the report (``report["passed"]`` is the verdict).

    ``options`` are checked here unless they already are a :class:`GateConfig`. Raises
    :class:`GateUsageError` (before touching the server) for bad options only.
    """
    cfg = options if isinstance(options, GateConfig) else GateConfig.from_options(options)
    t_start = time.monotonic()
    started = utc_now()

    def say(message: str) -> None:
        """Progress, prefixed with the seconds since the start."""
        if progress:
            progress(f"[{time.monotonic() - t_start:7.1f} s] {message}")

    tls = _tls(cfg)
    endpoint = Endpoint(cfg.url, cfg.api_key, tls=tls, server_name=cfg.tls_server_name)
    try:
        endpoint.guard = make_guard(endpoint.host, endpoint.port, cfg.listener_user)
    except ValueError as exc:
        raise GateUsageError(str(exc)) from exc
    public = _public_endpoint(cfg, tls)
    watcher = make_watcher(cfg)
    monitor = Monitor(watcher, max(0.2, min(cfg.poll_interval_s / 2.0, 1.0)))
    report = _new_report(cfg, endpoint, public, watcher, started.strftime(TIMESTAMP_FORMAT))
    run = _Run(endpoint, cfg, monitor, report, say, public)
    try:
        if not isinstance(watcher, NullWatcher):
            say(f"watching {report['watch']}")
        report["readiness"] = {}
        monitor.start()
        wait_ready(endpoint, cfg, monitor, say, report["readiness"])

        engine, info, model = _discover(run)
        say(f"engine {engine}{(' ' + str(report['version'])) if report['version'] else ''}, model {model}")
        agg = _measure(run, model, engine)

        run.enter("speculative")
        info_after = _info_after(run, engine)
        accept = _speculative(run, engine, info, info_after)
        report["speculative"] = {
            "accept_length": accept["value"],
            "source": accept["source"],
            "detail": {k: v for k, v in accept.items() if k not in ("value", "source")},
        }
        capacity = _capacity(engine, info, info_after)
        report["capacity"] = capacity
        if capacity["effective_max_running_requests"] is not None:
            say(f"at most {capacity['effective_max_running_requests']} running requests at once ({capacity['source']})")

        _correctness(run, engine, model)

        monitor.poll_now()
        monitor.check()
        judge(cfg, agg, accept, capacity, report)
    except GateFailure as exc:
        report["passed"] = False
        report["phase"] = exc.phase
        reason = exc.reason
        if exc.watch is not None:
            reason += f", {time.monotonic() - t_start:.1f} s into the gate while {PHASE_TEXT.get(exc.phase, exc.phase)}"
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
        report["duration_s"] = rounded(time.monotonic() - t_start, 3)
    if report["verdict"] is None:  # failed before it was judged
        report["verdict"] = verdict_of(report, cfg)
    report["summary"] = summary_line(report)
    say(report["summary"])
    return redact(report, [cfg.api_key or "", cfg.admin_api_key or ""])
