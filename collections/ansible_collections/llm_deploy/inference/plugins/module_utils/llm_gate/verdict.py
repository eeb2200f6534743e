# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The verdict, the one place for it: the absolute thresholds, the relative gate against the
last-known-good, the comparison with a reference server's figure (adoption, bake-off), the
baseline the next deploy compares with, and the words for all of them.

:func:`judge` puts it into the report as ``report["verdict"]`` (:func:`verdict_of`); the module
returns it, and the roles and playbooks read its fields instead of deciding again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import BASELINE_COUNTS, BASELINE_FIGURES, BASELINE_SETTINGS, TTFT_STATISTIC
from .correctness import judge_correctness, next_record, record_of, summary_part
from .discovery import CAPACITY_KEY
from .stats import rounded

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .config import GateConfig


def _fmt(value: float | None, digits: int = 1) -> str:
    """A figure with ``digits`` decimals, ``n/a`` when unknown."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def _limit(value: float, digits: int = 1) -> str:
    """A threshold as the summary shows it, ``off`` when 0."""
    return "off" if not value else (f"{round(value, digits + 1):g}")


def _requests(count: int) -> str:
    """``1 request``, ``4 requests``."""
    return f"{count} request{'' if count == 1 else 's'}"


def capacity_reason(value: int, requested: int | None, minimum: int) -> str:
    """Why a server that runs fewer requests at once than ``min_running_requests`` fails the gate."""
    asked = f"; {requested} asked" if requested is not None else ""
    return (
        f"SGLang runs at most {_requests(value)} at once (server_info {CAPACITY_KEY}{asked}), below "
        f"min_running_requests {minimum}: its mamba state or KV cache is too small for the target concurrency "
        "(see the launch plan's memory budget)"
    )


def _capacity_check(capacity: dict[str, Any] | None, cfg: GateConfig) -> tuple[dict[str, Any], str | None]:
    """The ``running_requests`` check against ``min_running_requests`` (on); (check, failure reason or None).

    An engine that reports no limit leaves the check ``ok: None`` with a ``not applied`` note:
    it is not counted as passed.
    """
    capacity = capacity or {}
    value = capacity.get("effective_max_running_requests")
    check: dict[str, Any] = {
        "name": "running_requests",
        "value": value,
        "op": ">=",
        "limit": cfg.min_running_requests,
    }
    if value is None:
        check.update(ok=None, note="not applied: " + (capacity.get("note") or "the engine reports none"))
        return check, None
    ok = value >= cfg.min_running_requests
    check.update(ok=ok, source=capacity.get("source"), requested=capacity.get("requested"))
    return check, None if ok else capacity_reason(value, capacity.get("requested"), cfg.min_running_requests)


def evaluate(
    agg: dict[str, Any], accept: dict[str, Any], cfg: GateConfig, capacity: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Compare the aggregate, the accept length and the running-request limit (``capacity``, the
    report's) with the thresholds; (checks, failure reasons).
    """
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []
    tps = agg.get("decode_tps_mean")
    if cfg.min_decode_tps > 0:
        ok = tps is not None and tps >= cfg.min_decode_tps
        checks.append(
            {
                "name": "decode_tps",
                "statistic": "mean",
                "value": tps,
                "op": ">=",
                "limit": cfg.min_decode_tps,
                "ok": ok,
            }
        )
        if tps is None:
            reasons.append("no request produced two or more tokens in separate chunks: decode speed unknown")
        elif not ok:
            reasons.append(f"decode {tps:.1f} tok/s is below min_decode_tps {cfg.min_decode_tps:g}")
    ttft = agg.get("ttft_p95_s")
    if cfg.max_ttft_s > 0:
        ok = ttft is not None and ttft <= cfg.max_ttft_s
        checks.append(
            {
                "name": "ttft",
                "statistic": TTFT_STATISTIC,
                "value": ttft,
                "op": "<=",
                "limit": cfg.max_ttft_s,
                "ok": ok,
            }
        )
        if not ok:
            reasons.append(f"TTFT {TTFT_STATISTIC} {_fmt(ttft, 2)} s is above max_ttft_s {cfg.max_ttft_s:g}")
    value = accept.get("value")
    if cfg.min_accept_length > 0:
        if value is None:
            checks.append(
                {
                    "name": "accept_length",
                    "value": None,
                    "op": ">=",
                    "limit": cfg.min_accept_length,
                    "ok": None,
                    "note": "not applied: " + (accept.get("note") or "the engine reports none"),
                }
            )
        else:
            ok = value >= cfg.min_accept_length
            checks.append(
                {
                    "name": "accept_length",
                    "value": value,
                    "op": ">=",
                    "limit": cfg.min_accept_length,
                    "ok": ok,
                    "source": accept.get("source"),
                }
            )
            if not ok:
                reasons.append(f"MTP accept length {value:.2f} is below min_accept_length {cfg.min_accept_length:g}")
    if cfg.min_running_requests > 0:
        check, reason = _capacity_check(capacity, cfg)
        checks.append(check)
        if reason:
            reasons.append(reason)
    return checks, reasons


def baseline_of(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of a report as a baseline record: what the relative gate compares with (the
    unit they were measured on, the figures, the measurement's settings, the time)."""
    agg = report.get("aggregate") or {}
    settings = report.get("settings") or {}
    return {
        "unit_sha256": (report.get("metadata") or {}).get("unit_sha256"),
        "decode_tps_mean": agg.get("decode_tps_mean"),
        "ttft_p95_s": agg.get("ttft_p95_s"),
        "accept_length": (report.get("speculative") or {}).get("accept_length"),
        "effective_max_running_requests": (report.get("capacity") or {}).get("effective_max_running_requests"),
        "timestamp": report.get("timestamp"),
        **{key: settings.get(key) for key in BASELINE_SETTINGS},
        # What the server said (the correctness probe), when it was asked this time.
        "correctness": (
            record_of(report["correctness"], (report.get("metadata") or {}).get("model_revision"))
            if report.get("correctness") and not report["correctness"].get("error")
            else None
        ),
    }


def next_baseline(
    kept: dict[str, Any] | None, figures: dict[str, Any], accept_output_change: bool = False
) -> dict[str, Any]:
    """The baseline the next deploy compares with, once a gate with these ``figures`` (:func:`baseline_of`)
    passed: the ``kept`` one (the last-known-good's, the gate's ``baseline`` option) when it was measured on
    the same unit with the same measurement, so that a no-op deploy keeps its record as it was; these
    ``figures`` otherwise. Its ``correctness`` record is :func:`.correctness.next_record`'s: the kept outputs
    while the probe set and the model revision are the same (unless ``accept_output_change``).
    """
    kept = kept or {}
    same = (
        bool(kept)
        and kept.get("unit_sha256", "") == figures.get("unit_sha256")
        and all(kept.get(key) == figures.get(key) for key in BASELINE_SETTINGS)
    )
    out = dict(kept) if same else dict(figures)
    out["correctness"] = next_record(kept.get("correctness"), figures.get("correctness"), accept_output_change)
    return out


# How a gate is compared with a reference server's decode tok/s (the ``reference`` option):
# min_share, a floor (adoption: the new server reaches this share of the by-hand one);
# margin_pct, a lead (bake-off: a candidate beats the last-known-good by more than this).
REFERENCE_MODES = ("min_share", "margin_pct")


def compare_reference(value: float | None, reference: dict[str, Any] | None) -> dict[str, Any] | None:
    """This gate's mean decode tok/s (``value``) against ``reference`` (``decode_tps_mean`` and one of
    :data:`REFERENCE_MODES`); None without a reference. Never fails the gate: the caller reads ``ok``.

    ``min_share``: ok when the share is 0 (off), when the reference has no figure, or when the value reaches
    ``needed`` = share x reference (both to one decimal, as the words show them; no figure counts as 0).
    ``margin_pct``: ok only when both figures are known and the value is above ``needed`` = reference x
    (1 + margin / 100). ``share`` is value / reference and ``change_pct`` the change in percent.
    """
    if not reference:
        return None
    base = reference.get("decode_tps_mean")
    known = value is not None and base is not None and base > 0
    out: dict[str, Any] = {
        "figure": "decode_tps_mean",
        "value": value,
        "reference": base,
        "share": round((value or 0.0) / base, 3) if base else None,
        "change_pct": round(100.0 * (value - base) / base, 2) if known else None,
    }
    if reference.get("min_share") is not None:
        share = float(reference["min_share"])
        needed = None if base is None else round(base * share, 1)
        out.update(value=round(value or 0.0, 1), min_share=share, needed=needed)
        out["ok"] = share == 0 or needed is None or out["value"] >= needed
    else:
        margin = float(reference["margin_pct"])
        needed = None if base is None else base * (1 + margin / 100.0)
        out.update(margin_pct=margin, needed=rounded(needed, 3))
        out["ok"] = value is not None and needed is not None and value > needed
    return out


def verdict_of(
    report: dict[str, Any],
    cfg: GateConfig,
    absolute: tuple[list[dict[str, Any]], list[str]] | None = None,
    relative: tuple[list[dict[str, Any]], list[str], str | None] | None = None,
    right: tuple[list[dict[str, Any]], list[str], list[str]] | None = None,
) -> dict[str, Any]:
    """The gate's verdict as the module returns it and the roles read it (``report["verdict"]``).

    ``passed`` and ``reasons`` (the report's); ``absolute`` (the thresholds: :func:`evaluate`) and
    ``relative`` (the last-known-good: :func:`compare_baseline`, with the ``baseline`` compared with),
    each ``{passed, checks, reasons}`` or None when the gate failed before it judged; ``reference``
    (:func:`compare_reference`); ``figures``, this gate's as a baseline record (:func:`baseline_of`;
    None before a measurement); ``baseline``, what the last-known-good records for the next deploy
    (:func:`next_baseline`; None unless the gate passed).
    """
    figures = baseline_of(report) if report.get("aggregate") else None
    passed = bool(report.get("passed"))
    verdict: dict[str, Any] = {
        "passed": passed,
        "reasons": list(report.get("reasons") or []),
        "absolute": None,
        "relative": None,
        "reference": compare_reference(figures["decode_tps_mean"], cfg.reference) if figures else None,
        "figures": figures,
        "baseline": next_baseline(cfg.baseline, figures, cfg.accept_output_change) if passed and figures else None,
        "correctness": None,
    }
    if absolute is not None:
        verdict["absolute"] = {"passed": not absolute[1], "checks": absolute[0], "reasons": absolute[1]}
    if relative is not None:
        checks, reasons, note = relative
        verdict["relative"] = {
            "passed": not reasons,
            "compared": bool(checks),
            "checks": checks,
            "reasons": reasons,
            "note": note,
            "baseline": cfg.baseline or None,
        }
    if right is not None:
        checks, reasons, notes = right
        probe = report.get("correctness") or {}
        verdict["correctness"] = {
            "passed": not reasons,
            "ran": bool(probe),
            "why": report.get("correctness_why"),
            "checks": checks,
            "reasons": reasons,
            "notes": notes,
        }
    return verdict


def judge(
    cfg: GateConfig, agg: dict[str, Any], accept: dict[str, Any], capacity: dict[str, Any], report: dict[str, Any]
) -> None:
    """Judge a measured server: the absolute thresholds and the relative gate; the checks, reasons, notes,
    ``passed`` and ``verdict`` go into ``report``.
    """
    report["phase"] = "evaluate"
    absolute = evaluate(agg, accept, cfg, capacity)
    relative = compare_baseline(agg, accept, cfg, capacity, report["settings"].get("fixed_output"))
    right = judge_correctness(report.get("correctness"), cfg)
    report["checks"] = absolute[0] + relative[0] + right[0]
    report["reasons"] = absolute[1] + relative[1] + right[1]
    if relative[2]:
        report["notes"].append(relative[2])
    report["notes"].extend(right[2])
    report["passed"] = not report["reasons"]
    report["phase"] = "done"
    report["verdict"] = verdict_of(report, cfg, absolute, relative, right)


def compare_baseline(
    agg: dict[str, Any],
    accept: dict[str, Any],
    cfg: GateConfig,
    capacity: dict[str, Any] | None = None,
    fixed_output: str | None = None,
) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """The relative gate: (checks, failure reasons, note) against ``cfg.baseline``.

    Compared only when there is a baseline, ``max_regression_pct`` is above 0, the unit is
    not the baseline's own (same unit sha256: nothing changed, so nothing to compare) and
    the measurement is the same (requests, concurrency, max_tokens, prompts, warmup_requests, and ``fixed_output``, how
    this gate asked the engine for exactly max_tokens tokens; a baseline without it is compared). A figure fails
    when it is worse than the baseline's by more than ``max_regression_pct`` percent; TTFT
    also needs to be worse by more than ``regression_min_ttft_delta_s`` seconds (a few tens
    of milliseconds of jitter are most of a small TTFT). The running-request limit (``capacity``,
    when both sides know it) fails on any drop: it is a count the server was sized for, not a
    measurement with noise.
    """
    baseline = cfg.baseline or {}
    pct = float(cfg.max_regression_pct or 0)
    if not baseline or pct <= 0:
        return [], [], None
    unit = (cfg.metadata or {}).get("unit_sha256")
    if unit and baseline.get("unit_sha256") == unit:
        return [], [], "not compared with the last-known-good: the unit is the last-known-good one"
    ours = {
        "warmup_requests": cfg.warmup_requests,
        "requests": cfg.requests,
        "concurrency": cfg.concurrency,
        "max_tokens": cfg.max_tokens,
        "prompts": cfg.prompt_ids,
        "fixed_output": fixed_output,
    }
    differs = [key for key in BASELINE_SETTINGS if baseline.get(key) is not None and baseline.get(key) != ours[key]]
    if differs:
        return (
            [],
            [],
            ("not compared with the last-known-good: it was measured with another {}".format(", ".join(differs))),
        )
    current = {
        "decode_tps_mean": agg.get("decode_tps_mean"),
        "ttft_p95_s": agg.get("ttft_p95_s"),
        "accept_length": accept.get("value"),
        "effective_max_running_requests": (capacity or {}).get("effective_max_running_requests"),
    }
    names = {
        "decode_tps_mean": "decode_tps",
        "ttft_p95_s": "ttft",
        "accept_length": "accept_length",
        "effective_max_running_requests": "running_requests",
    }
    labels = {
        "decode_tps_mean": ("decode", " tok/s", 1),
        "ttft_p95_s": (f"TTFT {TTFT_STATISTIC}", " s", 2),
        "accept_length": ("accept length", "", 2),
    }
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []
    for key, lower_is_worse in BASELINE_FIGURES.items():
        base, value = baseline.get(key), current[key]
        if base is None or value is None or base <= 0:
            continue
        change = 100.0 * (value - base) / base
        if key in BASELINE_COUNTS:
            limit, ok = base, value >= base
        else:
            worse = -change if lower_is_worse else change
            limit = base * (1 - pct / 100.0) if lower_is_worse else base * (1 + pct / 100.0)
            ok = worse <= pct
        if key == "ttft_p95_s" and not ok and value - base <= float(cfg.regression_min_ttft_delta_s or 0):
            ok = True
        checks.append(
            {
                "name": names[key] + "_vs_last_known_good",
                "value": value,
                "baseline": base,
                "change_pct": round(change, 2),
                "op": ">=" if lower_is_worse else "<=",
                "limit": round(limit, 4),
                "ok": ok,
            }
        )
        if key in BASELINE_COUNTS and not ok:
            reasons.append(
                f"SGLang runs at most {_requests(int(value))} at once, fewer than the last-known-good's "
                f"{int(base)} (server_info {CAPACITY_KEY}; any drop fails)"
            )
        elif not ok:
            what, unit_label, digits = labels[key]
            reasons.append(
                f"{what} {_fmt(value, digits)}{unit_label} is {abs(change):.1f} % "
                f"{'below' if lower_is_worse else 'above'} the last-known-good's {_fmt(base, digits)}{unit_label} "
                f"(max_regression_pct {pct:g})"
            )
    return checks, reasons, None


def summary_line(report: dict[str, Any]) -> str:
    """One line for the play output, e.g.
    ``gate PASS: 52.3 tok/s decode (min 40), TTFT p95 0.41 s (max 3), accept 2.10 (min 1.5), max running 4
    (min 4), 8 requests`` (``max running``: the requests the server runs at once, when known or checked).
    """
    verdict = "PASS" if report.get("passed") else "FAIL"
    agg = report.get("aggregate")
    th = report.get("thresholds") or {}
    if not agg:
        return f"gate {verdict} ({report.get('phase')}): {'; '.join(report.get('reasons') or [])}"
    parts = [
        f"{_fmt(agg.get('decode_tps_mean'))} tok/s decode (min {_limit(th.get('min_decode_tps', 0))})",
        f"TTFT {TTFT_STATISTIC} {_fmt(agg.get('ttft_p95_s'), 2)} s (max {_limit(th.get('max_ttft_s', 0))})",
    ]
    accept = (report.get("speculative") or {}).get("accept_length")
    if accept is not None or th.get("min_accept_length"):
        parts.append(f"accept {_fmt(accept, 2)} (min {_limit(th.get('min_accept_length', 0))})")
    running = (report.get("capacity") or {}).get("effective_max_running_requests")
    if running is not None or th.get("min_running_requests"):
        shown = "n/a" if running is None else str(running)
        parts.append(f"max running {shown} (min {_limit(th.get('min_running_requests', 0))})")
    right = summary_part(report.get("correctness"), report.get("checks") or [])
    if right:
        parts.append(right)
    relative = [
        c
        for c in report.get("checks") or []
        if c["name"].endswith("_vs_last_known_good") and c["name"] != "eval_score_vs_last_known_good"
    ]
    if relative:
        changes = ", ".join(f"{c['name'].split('_vs_')[0]} {c['change_pct']:+.1f} %" for c in relative)
        parts.append(f"vs last-known-good {changes}")
    line = f"gate {verdict}: {', '.join(parts)}, {int(agg.get('requests', 0))} requests"
    if not report.get("passed"):
        line += " - " + "; ".join(report.get("reasons") or [])
    return line


def failure_message(report: dict[str, Any]) -> str:
    """Summary plus evidence (unit state and the journal of this start) for a failed gate."""
    lines = [report.get("summary") or summary_line(report)]
    evidence = report.get("evidence") or {}
    if evidence.get("exception"):
        lines.append(f"exception: {evidence['exception']}")
    if evidence.get("log_source"):
        count = int(evidence.get("log_lines", 0))
        cap = f", capped to the last {count} lines" if evidence.get("log_capped") else ""
        lines.append(f"--- {evidence['log_source']} ({count} lines{cap}) ---")
        lines.append(evidence.get("log") or "(empty)")
        lines.append("--- end of log ---")
    return "\n".join(lines)
