# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The gate's own noise: repeated gates of one unchanged server and the spread of their figures.

The relative gate fails a deploy whose figures are worse than the last-known-good's by more than
``max_regression_pct``; that decision is only sound when two gates of the *same* server differ by
much less. :func:`run_repeat` runs ``runs`` whole gates back to back (each one stream at a time and,
when the concurrency asked is higher, at that concurrency too), and :func:`repeatability` computes,
per figure, the spread (max - min) / median in percent and compares it with a third of the margin.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from .config import TTFT_STATISTIC, GateConfig
from .gate import run_gate
from .stats import rounded

# The figures each run keeps, read from its report: (name, where in the report).
RUN_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("decode_tps_mean", ("aggregate", "decode_tps_mean")),
    ("decode_tps_median", ("aggregate", "decode_tps_median")),
    ("ttft_p50_s", ("aggregate", "ttft_p50_s")),
    ("ttft_p95_s", ("aggregate", "ttft_p95_s")),
    ("total_tps", ("aggregate", "total_tps")),
    ("accept_length", ("speculative", "accept_length")),
    ("effective_max_running_requests", ("capacity", "effective_max_running_requests")),
)
# The figures the relative gate compares (verdict.compare_baseline): their spread decides.
JUDGED = ("decode_tps_mean", "ttft_p95_s", "accept_length")
# A count the server was sized with, not a measurement: any change is reported, not a spread.
COUNTS = ("effective_max_running_requests",)


def spread_pct(values: Sequence[float | None]) -> float | None:
    """(max - min) / median in percent of the known values; None for fewer than two or a median of 0.

    ``spread_pct([139.208, 128.247, 189.734]) == 44.2`` (the bake-off's NEXTN gates, rounded).
    """
    known = [float(v) for v in values if v is not None]
    if len(known) < 2:
        return None
    middle = statistics.median(known)
    if middle <= 0:
        return None
    return 100.0 * (max(known) - min(known)) / middle


def _dig(report: dict[str, Any], path: tuple[str, ...]) -> Any:
    """``report[path[0]][path[1]]...``, None where a level is missing."""
    value: Any = report
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def run_figures(report: dict[str, Any]) -> dict[str, Any]:
    """One gate's figures for the repeatability table, with its verdict and per-request decode speeds."""
    figures = {name: _dig(report, path) for name, path in RUN_FIGURES}
    figures.update(
        passed=bool(report.get("passed")),
        reasons=list(report.get("reasons") or []),
        decode_tps_requests=[r.get("decode_tps") for r in report.get("requests") or []],
        completion_tokens=[r.get("completion_tokens") for r in report.get("requests") or []],
        duration_s=report.get("duration_s"),
    )
    right = (report.get("verdict") or {}).get("correctness") or {}
    if right.get("ran"):
        checks = {check["name"]: check for check in right.get("checks") or []}
        golden = checks.get("golden_outputs")
        figures["right"] = {
            "passed": bool(right.get("passed")),
            "reasons": list(right.get("reasons") or []),
            "eval_score": (checks.get("eval_score") or {}).get("value"),
            "golden_same": None if golden is None else f"{golden['same']}/{len(golden['prompts'])}",
            "duration_s": (report.get("correctness") or {}).get("duration_s"),
        }
    return figures


def repeatability(runs: Sequence[dict[str, Any]], margin_pct: float, min_ttft_delta_s: float = 0.0) -> dict[str, Any]:
    """The spread of each figure over ``runs`` (each :func:`run_figures`) against ``margin_pct`` / 3.

    A judged figure (``JUDGED``) is ``ok`` when its spread is under the limit; TTFT also when its
    range is within ``min_ttft_delta_s`` (the relative gate ignores a TTFT change that small). A
    figure no run reports is left out; ``ok`` overall needs every run to pass, every judged figure
    that is known to be ok, and at least two runs.
    """
    limit = float(margin_pct) / 3.0
    figures: dict[str, Any] = {}
    for name, _path in RUN_FIGURES:
        values = [run.get(name) for run in runs]
        known = [v for v in values if v is not None]
        if not known:
            continue
        row: dict[str, Any] = {
            "values": values,
            "median": rounded(statistics.median(known), 4),
            "min": min(known),
            "max": max(known),
        }
        if name in COUNTS:
            row["ok"] = len(set(known)) == 1
        else:
            spread = spread_pct(values)
            row["spread_pct"] = rounded(spread, 2)
            if name in JUDGED:
                small_ttft = name == "ttft_p95_s" and max(known) - min(known) <= min_ttft_delta_s
                row["ok"] = spread is not None and (spread < limit or small_ttft)
                if small_ttft and not (spread is not None and spread < limit):
                    row["note"] = f"range within the TTFT slack ({min_ttft_delta_s:g} s)"
        figures[name] = row
    judged_ok = [figures[name]["ok"] for name in (*JUDGED, *COUNTS) if name in figures]
    every_run_passed = all(run.get("passed") for run in runs)
    # The correctness probe on an unchanged server: every run after the first is compared with the
    # first's outputs and score (run_repeat); a failure there is a false failure.
    asked = [run for run in runs if run.get("right")]
    false_failures = [run.get("run") for run in asked[1:] if not run["right"]["passed"]]
    return {
        "runs": len(runs),
        "margin_pct": float(margin_pct),
        "limit_pct": round(limit, 2),
        "figures": figures,
        "every_run_passed": every_run_passed,
        "correctness": None if not asked else {"compared_runs": len(asked) - 1, "false_failures": false_failures},
        "ok": len(runs) >= 2 and every_run_passed and all(judged_ok) and not false_failures,
    }


def run_repeat(
    options: dict[str, Any] | GateConfig,
    runs: int,
    margin_pct: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the gate ``runs`` times against one server: one stream at a time and, when ``concurrency``
    is above 1, at that concurrency, alternating; the runs and their :func:`repeatability` per
    concurrency, plus ``ok`` (every concurrency ok).

    The relative gate is off in these runs (a baseline would compare each run with another server);
    the thresholds stay, so a run that fails them shows as such. With a probe set, every run asks
    the correctness probe, and every run after the first is held to the first one's outputs and
    eval score as a deploy is to its last-known-good's: what fails there is a false failure.
    """
    cfg = options if isinstance(options, GateConfig) else GateConfig.from_options(options)
    concurrencies = sorted({1, cfg.concurrency})
    t_start = time.monotonic()
    per: dict[int, list[dict[str, Any]]] = {c: [] for c in concurrencies}
    settings: dict[int, dict[str, Any]] = {}
    first_record: dict[str, Any] | None = None
    for index in range(runs):
        for concurrency in concurrencies:
            baseline = {"correctness": first_record} if first_record else None
            run_cfg = dataclasses.replace(
                cfg,
                concurrency=concurrency,
                baseline=baseline,
                max_regression_pct=0.0,
                correctness="off" if cfg.correctness == "off" else "always",
            )
            report = run_gate(run_cfg)
            if cfg.probe_set and first_record is None:
                first_record = ((report.get("verdict") or {}).get("figures") or {}).get("correctness")
            settings.setdefault(concurrency, report.get("settings") or {})
            figures = dict(run_figures(report), run=index + 1, concurrency=concurrency)
            per[concurrency].append(figures)
            if progress:
                progress(
                    f"[{time.monotonic() - t_start:7.1f} s] run {index + 1}/{runs}, concurrency {concurrency}: "
                    + (report.get("summary") or "")
                )
    result: dict[str, Any] = {
        "tool": "health_gate_repeat",
        "runs": runs,
        "url": cfg.url,
        "margin_pct": float(margin_pct),
        "limit_pct": round(float(margin_pct) / 3.0, 2),
        "concurrencies": {},
        "duration_s": rounded(time.monotonic() - t_start, 1),
    }
    for concurrency in concurrencies:
        result["concurrencies"][str(concurrency)] = {
            "settings": settings.get(concurrency),
            "runs": per[concurrency],
            "repeatability": repeatability(per[concurrency], margin_pct, cfg.regression_min_ttft_delta_s),
        }
    result["ok"] = all(c["repeatability"]["ok"] for c in result["concurrencies"].values())
    return result


def repeat_table(result: dict[str, Any]) -> str:
    """The repeat result as text: one line per run, then the spread of each figure against the limit."""
    lines = []
    for concurrency, block in result["concurrencies"].items():
        lines.append(f"concurrency {concurrency}:")
        lines.append("  run  decode mean  decode median  TTFT p50  TTFT p95  accept  max running  passed")
        for run in block["runs"]:
            lines.append(
                "  {:>3}  {:>11}  {:>13}  {:>8}  {:>8}  {:>6}  {:>11}  {}".format(
                    run["run"],
                    _cell(run.get("decode_tps_mean"), 1),
                    _cell(run.get("decode_tps_median"), 1),
                    _cell(run.get("ttft_p50_s"), 3),
                    _cell(run.get("ttft_p95_s"), 3),
                    _cell(run.get("accept_length"), 2),
                    _cell(run.get("effective_max_running_requests"), 0),
                    "yes" if run.get("passed") else "NO",
                )
            )
        rep = block["repeatability"]
        for name, row in rep["figures"].items():
            if "spread_pct" not in row and name not in COUNTS:
                continue
            what = f"spread {_cell(row.get('spread_pct'), 1)} %" if name not in COUNTS else "same in every run"
            verdict = "" if "ok" not in row else (" ok" if row["ok"] else " TOO NOISY")
            if row.get("note"):
                verdict += f" ({row['note']})"
            if name in COUNTS and not row["ok"]:
                what, verdict = f"changed ({row['min']}-{row['max']})", " NOT STEADY"
            label = name.replace("ttft_p95_s", f"TTFT {TTFT_STATISTIC}")
            lines.append(f"  {label}: {what}{verdict}")
        right = rep.get("correctness")
        if right:
            wrong = right["false_failures"]
            lines.append(
                f"  correctness: {right['compared_runs']} runs held to the first run's outputs and score, "
                + (f"false failures in runs {', '.join(map(str, wrong))}" if wrong else "no false failure")
            )
    verdict = "under" if result["ok"] else "NOT under"
    lines.append(
        f"gate noise {verdict} a third of the {result['margin_pct']:g} % margin ({result['limit_pct']:g} %) "
        f"over {result['runs']} runs, (max - min) / median, in {result['duration_s']:g} s"
    )
    return "\n".join(lines)


def _cell(value: float | None, digits: int) -> str:
    """A number for the table, ``n/a`` when unknown."""
    return "n/a" if value is None else f"{value:.{digits}f}"
