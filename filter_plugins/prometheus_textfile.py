"""Render the health gate's figures as a Prometheus textfile for node_exporter.

Kept instead of ``prometheus_client``: the text is made on the controller and
``ansible.builtin.copy`` writes it atomically on the host, so the library would replace only the
formatting, as a new controller dependency (docs/architecture.md, 'Hand-written code beside a
library or builtin').

``{{ report | prometheus_textfile({'host': inventory_hostname}) }}`` returns the text
exposition format (HELP and TYPE lines, one sample per line, a final newline) that
node_exporter's textfile collector reads from ``*.prom`` files, e.g.::

    # HELP llm_gate_decode_tokens_per_second Mean decode tokens/s per request measured by the health gate.
    # TYPE llm_gate_decode_tokens_per_second gauge
    llm_gate_decode_tokens_per_second{host="ct129"} 52.478
    # HELP llm_gate_ttft_seconds Time to first token measured by the health gate, by quantile.
    # TYPE llm_gate_ttft_seconds gauge
    llm_gate_ttft_seconds{host="ct129",quantile="0.5"} 0.2126
    llm_gate_ttft_seconds{host="ct129",quantile="0.95"} 0.2139
    ...

``report`` is either a flat mapping with the keys of ``GATE_FIELDS`` (``decode_tps``,
``ttft_p50_s``, ``ttft_p95_s``, ``accept_length`` (optional), ``passed``, ``timestamp``,
the thresholds ``min_decode_tps`` and ``min_accept_length``) or the health_gate module's
whole report (schema 1: ``aggregate.decode_tps_mean``, ``thresholds.min_accept_length``, ...);
``GATE_FIELDS`` is the one place that maps both to the metrics. ``passed`` is required;
a missing or ``null`` figure (a gate that failed before measuring, an engine without an
accept length) leaves its samples, HELP and TYPE out. ``timestamp`` is ISO 8601
(``2026-11-30T02:00:41Z``) or Unix seconds.

Write the text atomically (``ansible.builtin.copy`` with ``content`` renames a temporary
file into place) to ``/var/lib/node_exporter/textfile_collector/llm_gate.prom``, with
``changed_when: false``: the figures change on every run, and a measurement is not a
change to the host (a no-op deploy must report zero changed tasks).

``{{ now().timestamp() | prometheus_rollback_textfile({'host': inventory_hostname}) }}``
renders ``llm_rollback_last_timestamp_seconds`` for ``llm_rollback.prom`` beside it
(inference_server's rollback writes it; roles/monitoring alerts on it).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used without Ansible (tests, tools)

    class AnsibleFilterError(ValueError):  # type: ignore[no-redef]
        """Stand-in for Ansible's filter error."""


# Input key -> where to find it: first in a flat mapping, then in the gate's full report.
GATE_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "decode_tps": (("decode_tps",), ("aggregate", "decode_tps_mean")),
    "ttft_p50_s": (("ttft_p50_s",), ("aggregate", "ttft_p50_s")),
    "ttft_p95_s": (("ttft_p95_s",), ("aggregate", "ttft_p95_s")),
    "accept_length": (("accept_length",), ("speculative", "accept_length")),
    "passed": (("passed",),),
    "timestamp": (("timestamp",),),
    # The gate's own thresholds (the inventory's), so alert rules compare with them per host.
    "min_decode_tps": (("min_decode_tps",), ("thresholds", "min_decode_tps")),
    "min_accept_length": (("min_accept_length",), ("thresholds", "min_accept_length")),
    # The correctness probe's eval (absent when the probe did not run, as on a no-op deploy).
    "eval_score": (("eval_score",), ("correctness", "eval", "score")),
    "min_eval_score": (("min_eval_score",), ("thresholds", "min_eval_score")),
}
REQUIRED_FIELDS = ("passed",)


class Family(NamedTuple):
    """One metric family of the textfile: its name, HELP text and samples, each (input key, extra labels)."""

    name: str
    help: str
    samples: tuple[tuple[str, dict[str, str]], ...]
    kind: str = "gauge"


def _gauge(name: str, key: str, help_text: str) -> Family:
    """A family of one sample: the figure ``key`` with the common labels only."""
    return Family(name, help_text, ((key, {}),))


def _threshold(name: str, key: str, what: str) -> Family:
    """A family for one of the gate's thresholds: the role's ``health_gate_<key>`` (0 turns its check off)."""
    return _gauge(name, key, f"{what} threshold of the last health gate (health_gate_{key}; 0 = off).")


# Metric families in output order.
METRICS: tuple[Family, ...] = (
    _gauge(
        "llm_gate_decode_tokens_per_second",
        "decode_tps",
        "Mean decode tokens/s per request measured by the health gate.",
    ),
    Family(
        "llm_gate_ttft_seconds",
        "Time to first token measured by the health gate, by quantile.",
        (("ttft_p50_s", {"quantile": "0.5"}), ("ttft_p95_s", {"quantile": "0.95"})),
    ),
    _gauge(
        "llm_gate_accept_length",
        "accept_length",
        "Speculative decoding (MTP) accept length measured by the health gate.",
    ),
    _gauge("llm_gate_passed", "passed", "1 when the last health gate passed, 0 when it failed."),
    _gauge("llm_gate_last_run_timestamp_seconds", "timestamp", "Unix time at which the last health gate started."),
    _threshold("llm_gate_min_decode_tokens_per_second", "min_decode_tps", "Decode tokens/s"),
    _threshold("llm_gate_min_accept_length", "min_accept_length", "Accept length"),
    _gauge(
        "llm_gate_eval_score",
        "eval_score",
        "Share of the correctness probe's eval the server answered exactly, when the last health gate asked it.",
    ),
    _threshold("llm_gate_min_eval_score", "min_eval_score", "Eval score"),
)

# Written by inference_server's rollback (tasks/rollback.yml) to llm_rollback.prom.
ROLLBACK_METRICS: tuple[Family, ...] = (
    _gauge(
        "llm_rollback_last_timestamp_seconds",
        "timestamp",
        "Unix time at which a deploy last rolled this host back to its last-known-good state.",
    ),
)

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset({"quantile", "le"})


def _lookup(report: Mapping[str, Any], paths: Sequence[Sequence[str]]) -> Any:
    """The first value found along ``paths`` (``None`` when none holds one)."""
    for path in paths:
        node: Any = report
        for key in path:
            if not isinstance(node, Mapping) or key not in node:
                node = None
                break
            node = node[key]
        if node is not None:
            return node
    return None


def _number(key: str, value: Any) -> float | None:
    """A finite float, ``None`` for missing/NaN; an error for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise AnsibleFilterError(f"prometheus_textfile: {key} must be a number, got a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError(f"prometheus_textfile: {key} must be a number, got {value!r}") from None
    if math.isnan(number):
        return None
    if math.isinf(number):
        raise AnsibleFilterError(f"prometheus_textfile: {key} must be finite, got {value!r}")
    return number


def _passed(value: Any) -> float:
    """1.0 / 0.0 from a boolean (or the strings true/false, 1/0)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return 1.0
    if text in ("false", "no", "0"):
        return 0.0
    raise AnsibleFilterError(f"prometheus_textfile: passed must be a boolean, got {value!r}")


def _timestamp(value: Any) -> float | None:
    """Unix seconds from ISO 8601 text (``Z`` or an offset; naive = UTC) or a number."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number("timestamp", value)
    else:
        text = str(value).strip()
        try:
            moment = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            try:
                return _number("timestamp", text)
            except AnsibleFilterError:
                raise AnsibleFilterError(
                    f"prometheus_textfile: timestamp must be ISO 8601 or Unix seconds, got {value!r}"
                ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def gate_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The gate's figures as numbers keyed like ``GATE_FIELDS`` (``None`` = not measured)."""
    if not isinstance(report, Mapping):
        raise AnsibleFilterError(
            f"prometheus_textfile expects a mapping (the gate report), got {type(report).__name__}"
        )
    raw = {key: _lookup(report, paths) for key, paths in GATE_FIELDS.items()}
    for key in REQUIRED_FIELDS:
        if raw[key] is None:
            raise AnsibleFilterError(f"prometheus_textfile: the report has no '{key}'")
    values: dict[str, float | None] = {}
    for key, value in raw.items():
        if key == "passed":
            values[key] = _passed(value)
        elif key == "timestamp":
            values[key] = _timestamp(value)
        else:
            values[key] = _number(key, value)
    return values


def _escape(value: Any) -> str:
    """A label value escaped for the text format."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Validated, sorted label pairs."""
    if labels is None:
        return []
    if not isinstance(labels, Mapping):
        raise AnsibleFilterError(f"prometheus_textfile: labels must be a mapping, got {type(labels).__name__}")
    pairs = []
    for name, value in labels.items():
        name = str(name)
        if not _LABEL_NAME.match(name) or name.startswith("__") or name in _RESERVED_LABELS:
            raise AnsibleFilterError(f"prometheus_textfile: '{name}' is not a usable label name")
        if value is None:
            raise AnsibleFilterError(f"prometheus_textfile: label '{name}' has no value")
        pairs.append((name, str(value)))
    return sorted(pairs)


def _format_value(value: float) -> str:
    """Shortest exact text of a sample value."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _render(families: Sequence[Family], values: Mapping[str, float | None], labels: Mapping[str, Any] | None) -> str:
    """``families`` with ``values`` (``None`` leaves a sample out) in text exposition format."""
    common = _labels(labels)
    lines: list[str] = []
    for name, help_text, samples, kind in families:
        rendered = []
        for key, extra in samples:
            value = values.get(key)
            if value is None:
                continue
            pairs = common + sorted(extra.items())
            label_text = "{{{}}}".format(",".join(f'{k}="{_escape(v)}"' for k, v in pairs)) if pairs else ""
            rendered.append(f"{name}{label_text} {_format_value(value)}")
        if rendered:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(rendered)
    return "\n".join(lines) + "\n"


def prometheus_textfile(report: Mapping[str, Any], labels: Mapping[str, Any] | None = None) -> str:
    """The gate report as Prometheus text exposition format (see the module docstring)."""
    return _render(METRICS, gate_metrics(report), labels)


def prometheus_rollback_textfile(timestamp: Any, labels: Mapping[str, Any] | None = None) -> str:
    """A rollback's time (ISO 8601 or Unix seconds) as ``llm_rollback_last_timestamp_seconds``."""
    moment = _timestamp(timestamp)
    if moment is None:
        raise AnsibleFilterError("prometheus_rollback_textfile: the rollback's timestamp is missing")
    return _render(ROLLBACK_METRICS, {"timestamp": moment}, labels)


class FilterModule:
    """Ansible filters for the Prometheus textfile of the health gate."""

    def filters(self) -> dict[str, Any]:
        """Map filter names to functions."""
        return {
            "prometheus_textfile": prometheus_textfile,
            "prometheus_rollback_textfile": prometheus_rollback_textfile,
        }
