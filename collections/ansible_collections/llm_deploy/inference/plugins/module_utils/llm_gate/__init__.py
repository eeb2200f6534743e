# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Health-and-throughput gate for OpenAI-compatible LLM servers (SGLang, transformers serve).

One implementation, two front ends: the Ansible module ``health_gate``
(``roles/health_gate/library/health_gate.py``; AnsiballZ ships the package) and the command
line ``tools/health-gate``, both importing it by its one name, module_utils of the repository's
collection: ``ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate``.
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
3. **Measurement.** Untimed warm-up requests at the measurement's shapes (its prompts
   from the first on, its concurrency and output length), then N streaming chat
   completions (temperature 0, exactly ``max_tokens`` tokens where the engine can be told
   so: SGLang ``ignore_eos``, transformers serve ``min_new_tokens``;
   ``stream_options.include_usage``) with a configurable concurrency. Per request: TTFT,
   inter-chunk latency, decode tokens/s
   = (completion_tokens - 1) / (t_last_token - t_first_token), end-to-end latency.
   Token counts come from the server's ``usage``, never from chunk counts.
4. **Speculative decoding and capacity** (SGLang, one more ``/server_info`` read): the MTP
   accept length from ``internal_states[0].avg_spec_accept_length``, else from a
   ``/generate`` call's ``meta_info.spec_accept_length``; the requests the scheduler runs at
   once from ``internal_states[0].effective_max_running_requests_per_dp`` (SGLang 0.5.17
   starts with it capped below ``--max-running-requests`` when the mamba state cache is small).
5. **Verdict** (:mod:`.verdict`, the one place for it). Mean decode tok/s >= ``min_decode_tps``,
   TTFT p95 <= ``max_ttft_s``, accept length >= ``min_accept_length`` and running requests >=
   ``min_running_requests`` (each of the last two only when the engine reports it); with a
   ``baseline``, the relative gate against the last-known-good; with a ``reference``, this
   server's decode speed against another's (reported, never failing the gate). The report's
   ``verdict`` holds all of it and the ``baseline`` the last-known-good records next.

The result is one JSON-serialisable report (:func:`run_gate` never raises for a failed
gate, only :class:`GateUsageError` for bad options); :func:`store_report` keeps it on
disk as ``<UTC timestamp>.json`` plus ``latest.json`` and prunes the history.

One concern a module: :mod:`.config` (options, rules, :class:`GateConfig`), :mod:`.prompts`,
:mod:`.errors`, :mod:`.stats`, :mod:`.redaction`, :mod:`.client` (HTTP), :mod:`.watchers`
and :mod:`.monitor` (unit or PID), :mod:`.readiness`, :mod:`.discovery`, :mod:`.streaming`,
:mod:`.verdict`, :mod:`.probeset`, :mod:`.probe`, :mod:`.correctness` and :mod:`.eval_compare`
(what the server says: the probe set, its requests, their judgement, the eval against the
last-known-good's), :mod:`.report` (storage), :mod:`.gate` (:func:`run_gate`) and :mod:`.repeat`
(:func:`run_repeat`: the gate's own noise over repeated gates of one server). The names
below are the package's public face; import them from ``llm_gate`` itself.
"""

from __future__ import annotations

from .client import BODY_QUOTE_CHARS, Endpoint, quote_body
from .config import (
    BASELINE_COUNTS,
    BASELINE_FIGURES,
    BASELINE_SETTINGS,
    CHOICE_OPTIONS,
    CORRECTNESS_MODES,
    DEFAULTS,
    ENGINES,
    RANGE_RULES,
    REFERENCE_KEYS,
    SCHEMA_VERSION,
    TTFT_STATISTIC,
    GateConfig,
    make_config,
    validate_config,
    variable_problems,
)
from .correctness import (
    ACCEPT_VARIABLE,
    CONFIDENCES,
    RECORD_SCHEMA,
    compare_golden,
    judge_correctness,
    next_record,
    record_of,
    reference_of,
    wanted,
)
from .discovery import (
    CAPACITY_KEY,
    CAPACITY_SOURCE,
    SERVER_INFO_KEYS,
    SERVER_INFO_PATHS,
    accept_length_from_info,
    capacity_from_info,
    generate_accept_length,
    get_server_info,
    keys_readable,
    keys_readable_note,
    list_models,
    resolve_model,
)
from .errors import GateFailure, GateUsageError, RequestError, WatchFailure
from .eval_compare import (
    counts_from_totals,
    paired_counts,
    refusal_probability,
    refuses,
    sign_test_p,
    smallest_refused_drop,
)
from .gate import run_gate
from .monitor import Monitor
from .probe import ENGINE_CALLS, run_probe
from .probeset import SplitMix64, digest_of, eval_items, extract_answer, golden_prompts, load_probe_set
from .prompts import FALLBACK_PROMPTS, load_prompts
from .readiness import HEALTH_PATH, PHASE_TEXT, STATE_TEXT, probe_health, wait_ready
from .redaction import redact, redact_text
from .repeat import repeat_table, repeatability, run_repeat, spread_pct
from .report import REPORT_NAME_RE, store_report, utc_now
from .stats import aggregate, decode_tps, percentile
from .streaming import CHAT_PATH, FIXED_OUTPUT, RequestResult, fixed_output_fields, run_requests, stream_chat
from .verdict import (
    REFERENCE_MODES,
    baseline_of,
    capacity_reason,
    compare_baseline,
    compare_reference,
    evaluate,
    failure_message,
    judge,
    next_baseline,
    summary_line,
    verdict_of,
)
from .watchers import (
    CLD_CODES,
    EXCEPTION_RE,
    UNIT_PROPERTIES,
    NullWatcher,
    PidWatcher,
    UnitWatcher,
    cap_lines,
    last_exception_line,
    make_watcher,
)

__all__ = [
    "ACCEPT_VARIABLE",
    "RECORD_SCHEMA",
    "counts_from_totals",
    "paired_counts",
    "refusal_probability",
    "refuses",
    "sign_test_p",
    "smallest_refused_drop",
    "BASELINE_COUNTS",
    "BASELINE_FIGURES",
    "BASELINE_SETTINGS",
    "BODY_QUOTE_CHARS",
    "CAPACITY_KEY",
    "CAPACITY_SOURCE",
    "CHAT_PATH",
    "CHOICE_OPTIONS",
    "CLD_CODES",
    "CONFIDENCES",
    "CORRECTNESS_MODES",
    "DEFAULTS",
    "ENGINES",
    "ENGINE_CALLS",
    "EXCEPTION_RE",
    "FALLBACK_PROMPTS",
    "FIXED_OUTPUT",
    "HEALTH_PATH",
    "PHASE_TEXT",
    "RANGE_RULES",
    "REFERENCE_KEYS",
    "REFERENCE_MODES",
    "REPORT_NAME_RE",
    "SCHEMA_VERSION",
    "SERVER_INFO_KEYS",
    "SERVER_INFO_PATHS",
    "STATE_TEXT",
    "TTFT_STATISTIC",
    "UNIT_PROPERTIES",
    "Endpoint",
    "GateConfig",
    "GateFailure",
    "GateUsageError",
    "Monitor",
    "NullWatcher",
    "PidWatcher",
    "RequestError",
    "RequestResult",
    "SplitMix64",
    "UnitWatcher",
    "WatchFailure",
    "accept_length_from_info",
    "aggregate",
    "baseline_of",
    "cap_lines",
    "capacity_from_info",
    "capacity_reason",
    "compare_golden",
    "compare_baseline",
    "compare_reference",
    "decode_tps",
    "digest_of",
    "eval_items",
    "extract_answer",
    "evaluate",
    "failure_message",
    "fixed_output_fields",
    "golden_prompts",
    "generate_accept_length",
    "keys_readable",
    "keys_readable_note",
    "get_server_info",
    "judge",
    "judge_correctness",
    "last_exception_line",
    "list_models",
    "load_probe_set",
    "load_prompts",
    "make_config",
    "make_watcher",
    "next_baseline",
    "next_record",
    "percentile",
    "probe_health",
    "quote_body",
    "record_of",
    "redact",
    "redact_text",
    "reference_of",
    "repeat_table",
    "repeatability",
    "resolve_model",
    "run_gate",
    "run_probe",
    "run_repeat",
    "run_requests",
    "spread_pct",
    "store_report",
    "stream_chat",
    "summary_line",
    "utc_now",
    "validate_config",
    "variable_problems",
    "verdict_of",
    "wait_ready",
    "wanted",
]
