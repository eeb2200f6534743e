"""Filters of playbooks/bakeoff.yml: the figures of a gate report, and the bake-off table.

    {{ report | bakeoff_figures }}             -> {decode_tps_mean, ttft_p95_s, total_tps, reference, right, ...}
    {{ table | bakeoff_markdown }}             -> the Markdown table of a bake-off

Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def bakeoff_figures(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures a bake-off compares, from one health-gate report ({} when there is none)."""
    if not report:
        return {}
    agg = report.get("aggregate") or {}
    settings = report.get("settings") or {}
    return {
        "passed": bool(report.get("passed")),
        "decode_tps_mean": agg.get("decode_tps_mean"),
        "ttft_p95_s": agg.get("ttft_p95_s"),
        "total_tps": agg.get("total_tps"),
        "accept_length": (report.get("speculative") or {}).get("accept_length"),
        "requests": agg.get("requests"),
        "concurrency": settings.get("concurrency"),
        "summary": report.get("summary"),
        "timestamp": report.get("timestamp"),
        "unit_sha256": (report.get("metadata") or {}).get("unit_sha256"),
        # The gate's comparison with the incumbent (a candidate's trial: health_gate_reference), whose
        # ``ok`` says whether it beats it by the margin; None for the incumbent's own gates.
        "reference": (report.get("verdict") or {}).get("reference"),
        # What the server said (the correctness probe): its verdict and the checks' values.
        "right": _right(report),
    }


def _right(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The correctness part of a gate report: passed, reasons, the eval's score and the golden matches."""
    part = (report.get("verdict") or {}).get("correctness")
    if not part or not part.get("ran"):
        return None
    checks = {check["name"]: check for check in part.get("checks") or []}
    golden = checks.get("golden_outputs") or {}
    ev = checks.get("eval_score") or {}
    return {
        "passed": bool(part.get("passed")),
        "reasons": list(part.get("reasons") or []),
        "eval": None if not ev else f"{ev.get('correct')}/{ev.get('count')}",
        "golden": None if not golden else f"{sum(1 for r in golden['prompts'] if r['ok'])}/{len(golden['prompts'])}",
    }


def _right_cell(right: Mapping[str, Any] | None) -> str:
    """``yes (eval 20/20, golden 5/5)``, ``no (eval 3/20)``, ``-`` when the probe did not run."""
    if not right:
        return "-"
    parts = [f"{name} {right[name]}" for name in ("eval", "golden") if right.get(name)]
    return ("yes" if right["passed"] else "no") + (f" ({', '.join(parts)})" if parts else "")


def _num(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def bakeoff_markdown(table: Mapping[str, Any]) -> str:
    """The bake-off table as Markdown: one row per candidate, the incumbent first, then the decision."""
    rows = table.get("rows") or []
    conc = table.get("concurrency")
    lines = [
        f"# Bake-off on {table.get('host')} ({table.get('finished')})",
        "",
        f"Same prompts for every row: single-stream, then {conc} at a time. The winner must beat the "
        f"last-known-good's single-stream decode tok/s by more than {table.get('margin_pct')} %.",
        "",
        f"| candidate | passed | right | decode tok/s (1) | TTFT p95 s (1) | accept length | decode tok/s ({conc}) | "
        f"total tok/s ({conc}) | TTFT p95 s ({conc}) | vs last-known-good |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = (rows[0].get("single") or {}).get("decode_tps_mean") if rows else None
    for row in rows:
        one, many = row.get("single") or {}, row.get("concurrent") or {}
        tps = one.get("decode_tps_mean")
        versus = "-" if row.get("incumbent") or not base or tps is None else f"{100 * (tps - base) / base:+.1f} %"
        name = f"{row['name']} (incumbent)" if row.get("incumbent") else row["name"]
        lines.append(
            f"| {name} | {'yes' if row.get('passed') else 'no'} | {_right_cell(one.get('right'))} | {_num(tps, 1)} | "
            f"{_num(one.get('ttft_p95_s'), 3)} | {_num(one.get('accept_length'), 2)} | "
            f"{_num(many.get('decode_tps_mean'), 1)} | {_num(many.get('total_tps'), 1)} | "
            f"{_num(many.get('ttft_p95_s'), 3)} | {versus} |"
        )
    failed = [row for row in rows if row.get("failure")]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {row['name']}: {row['failure']}" for row in failed]
    wrong = [row for row in rows if ((row.get("single") or {}).get("right") or {}).get("reasons")]
    if wrong:
        lines += ["", "Not right (the correctness probe):", ""]
        lines += [f"- {row['name']}: {'; '.join(row['single']['right']['reasons'])}" for row in wrong]
    lines += ["", f"Decision: {table.get('decision')}", ""]
    return "\n".join(lines)


class FilterModule:
    """Filters of the bake-off playbook."""

    def filters(self) -> dict[str, Callable[..., Any]]:
        """Map filter names to functions."""
        return {"bakeoff_figures": bakeoff_figures, "bakeoff_markdown": bakeoff_markdown}
