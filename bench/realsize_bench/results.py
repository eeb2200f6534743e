"""The controller's side of ``bench/realsize`` after the GPU runs: the results.

``collect`` merges the plan's prediction (``cases.json``) and SGLang's logged figures into
``bench/results/realsize.json``/``.md`` (``--name`` for another version's run, e.g.
``realsize-0.5.17``; and, from the drain run, ``restart_drain.json``);
``bakeoff`` writes the bake-off's table (``bench/results/bakeoff_gpu.json``/``.md``).
``bench/realsize`` (the executable) parses the command line and calls these.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

# What collect records as the command when --command does not name the exact ones.
DEFAULT_COMMAND = (
    "bench/realsize cases; tools/gpu-acceptance prepare --plan ...; on the GPU machine: "
    "tools/gpu-acceptance receive/install, bench/realsize device; bench/realsize collect"
)


def ratio(predicted: Any, logged: Any) -> float | None:
    """predicted / logged (None when either is missing)."""
    return round(predicted / logged, 3) if predicted and logged else None


def cmd_collect(args: argparse.Namespace) -> int:
    """Merge the prediction (cases.json) and the device's figures into bench/results."""
    cases = {c["name"]: c for c in json.loads(args.cases.read_text())["cases"]}
    device: dict[str, Any] = {"cases": {}}
    for path in args.device_json:
        data = json.loads(path.read_text())
        device["cases"].update(data.get("cases", {}))
        device.update({k: v for k, v in data.items() if k != "cases"})
    rows = []
    for name, case in cases.items():
        got = device["cases"].get(name)
        if got is None:
            continue
        logged = {k: got["logged"].get(k) for k in ("kv_tokens", "mamba_slots")}
        logged["max_running"] = got["logged"].get("effective_max_running") or got["logged"].get("max_running")
        predicted = case.get("predicted") or {}
        row = {
            "name": name,
            "argv": got["argv"],
            "plan_refused": case["refused"],
            "plan_error": case.get("plan_error"),
            "predicted": predicted,
            "logged": logged,
            "ratios": {k: ratio(predicted.get(k), logged.get(k)) for k in logged},
            "launched": got["launched"],
            "error": got.get("error"),
            "ready_s": got.get("ready_s"),
            "measured": got.get("measured"),
            "sglang_lines": got["logged"]["lines"],
        }
        # What newer SGLang logs and reports beyond 0.5.11's figures (absent keys: not logged).
        extra = {
            "requested_running": _flag(got["argv"], "--max-running-requests"),
            "logged_max_running_requests": got["logged"].get("scheduler_max_running"),
            "max_total_num_tokens": got["logged"].get("max_total_num_tokens"),
            **{k: v for k, v in got["logged"].items() if k.startswith("capped_")},
            "server_state": (got.get("server_info") or {}).get("state"),
            "captured": got.get("captured"),
            "notable_lines": got["logged"].get("notable"),
        }
        if device.get("versions"):  # a run that records them (bench/realsize device since 0.5.17's run)
            row.update({k: v for k, v in extra.items() if v is not None})
        rows.append(row)
    launched = [r for r in rows if r["launched"]]
    first = launched[0] if launched else {}
    info = (device["cases"].get(first.get("name", ""), {}).get("server_info") or {}).get("args", {})
    result = {
        "sglang_version": info.get("version") or "0.5.11",
        "gpu": args.gpu,
        "tp_size": 1,
        "load_format": "dummy",
        "attention_backend": info.get("attention_backend"),
        "cases": rows,
        "cold_ready_s": first.get("ready_s"),
        "warm_ready_s": device["cases"].get("warm_restart", {}).get("ready_s"),
        "decode_tps_1": (first.get("measured") or {}).get("single", {}).get("decode_tps"),
        "decode_tps_8": (first.get("measured") or {}).get("streams_8", {}).get("agg_tps"),
        "accept_length": (first.get("measured") or {}).get("single", {}).get("accept_length"),
        "command": getattr(args, "run_command", None) or DEFAULT_COMMAND,
    }
    if device.get("versions"):
        result["versions"] = device["versions"]
    drain = device.get("drain")
    if drain:
        result["drain"] = {k: v for k, v in drain.items() if k != "old_log"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(markdown(result))
    if drain:
        (args.out / "restart_drain.json").write_text(
            json.dumps(
                {k: drain[k] for k in ("engine", "streams", "cut", "downtime_s", "warm_start_s")} | {"detail": drain},
                indent=1,
            )
            + "\n"
        )
    print(markdown(result))
    return 0


def cmd_bakeoff(args: argparse.Namespace) -> int:
    """The bake-off's table (bench/results/bakeoff_gpu.json/.md) from the device's figures: each
    candidate's median gate, the spread of its gates, and the winner (highest decode tok/s)."""
    import statistics

    cases = {c["name"]: c for c in json.loads(args.cases.read_text())["cases"]}
    ran: dict[str, Any] = {}
    for path in args.device_json:
        ran.update(json.loads(path.read_text()).get("cases", {}))
    rows, spreads = [], []
    for name, case in cases.items():
        got = ran.get(name, {})
        gates = [g for g in got.get("gates", []) if g.get("decode_tps")]
        tps = [g["decode_tps"] for g in gates]
        median = statistics.median(tps) if tps else None
        if median:
            spreads.append(100 * (max(tps) - min(tps)) / median)
        rows.append(
            {
                "name": name,
                "algorithm": case.get("algorithm") or "none",
                "launched": bool(got.get("launched")),
                "decode_tps": median,
                "accept_length": statistics.median([g["accept_length"] for g in gates if g.get("accept_length")] or [0])
                or None,
                "ttft_p95_s": statistics.median([g["ttft_p95_s"] for g in gates]) if gates else None,
                "agg_tps": ((got.get("measured") or {}).get("streams_8") or {}).get("agg_tps"),
                "gate_decode_tps": tps,
                "error": got.get("error"),
                "argv": got.get("argv"),
            }
        )
    launched = [r for r in rows if r["launched"] and r["decode_tps"]]
    winner = max(launched, key=lambda r: r["decode_tps"])["name"] if launched else None
    result = {
        "candidates": rows,
        "winner": winner,
        "gate_repeatability_pct": round(statistics.median(spreads), 1) if spreads else None,
        "gate_spread_pct": {
            r["name"]: round(100 * (max(r["gate_decode_tps"]) - min(r["gate_decode_tps"])) / r["decode_tps"], 1)
            for r in launched
        },
        "gpu": args.gpu,
        "model": "tiny Qwen3.6-27B-shaped target (tools/make-tiny-model --vision --with-mtp) "
        "and a tiny random DFlash drafter (block 16), random weights",
        "tp_size": 1,
        "command": "bench/realsize device --cases CASES --gates 3 --gate-requests 4 --drafter DIR; "
        "bench/realsize bakeoff",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bakeoff_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Speculative decoding bake-off on one H200 (real SGLang 0.5.11, launched from our plans)",
        "",
        f"{result['model']}; TP 1. Each candidate: 3 runs of our gate (4 streamed requests of 256 tokens, "
        "one at a time), the median shown; 8 requests at once for the aggregate. Command: "
        f"{result['command']}.",
        "",
        "| candidate | algorithm | launched | decode tok/s (median of 3 gates) | gates | accept length | "
        "TTFT p95 s | 8 at once tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['algorithm']} | {r['launched']} | {r['decode_tps']} | "
            f"{', '.join(str(t) for t in r['gate_decode_tps'])} | {r['accept_length']} | {r['ttft_p95_s']} | "
            f"{r['agg_tps']} |"
        )
    lines += [
        "",
        f"Winner: **{winner}**. With random weights every draft is rejected (accept length 1.0), so "
        "each speculative step costs its drafts and yields one token: no speculative decoding wins, as it "
        "should. On ct129 with the real weights the same table decides between NEXTN and the team's drafter "
        "(docs/bakeoff.md).",
        f"Gate repeatability: spread (max - min) / median of the three gates per candidate "
        f"{result['gate_spread_pct']} %, median {result['gate_repeatability_pct']} %. The first candidate's "
        "spread includes its first requests after a cold start (JIT).",
        "",
    ]
    (args.out / "bakeoff_gpu.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _flag(argv: list[str], name: str) -> int | None:
    """The integer value of ``name`` in argv (None when absent)."""
    return int(argv[argv.index(name) + 1]) if name in argv else None


def _cell(row: dict[str, Any], key: str) -> str:
    """One figure of a case: predicted / logged (ratio)."""
    return f"{row['predicted'].get(key)} / {row['logged'].get(key)} ({row['ratios'].get(key)})"


def markdown(result: dict[str, Any]) -> str:
    """The results as a table."""
    lines = [
        f"# SGLang {result['sglang_version']} at Qwen3.6-27B's real size, launched from our plan",
        "",
        f"GPU: {result['gpu']}, TP {result['tp_size']}, `--load-format {result['load_format']}`, "
        f"attention backend {result['attention_backend']}. Command: {result['command']}.",
        "",
        "| case | plan | SGLang | KV tokens pred / logged | mamba slots pred / logged | "
        "running pred / logged | ready s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["cases"]:
        lines.append(
            f"| {row['name']} | {'refused' if row['plan_refused'] else 'accepted'} | "
            f"{'started' if row['launched'] else 'failed: ' + str(row['error'])} | {_cell(row, 'kv_tokens')} | "
            f"{_cell(row, 'mamba_slots')} | {_cell(row, 'max_running')} | {row['ready_s']} |"
        )
    lines += [
        "",
        f"Cold ready {result['cold_ready_s']} s"
        + (f", warm ready {result['warm_ready_s']} s" if result["warm_ready_s"] or not result.get("versions") else "")
        + "; single stream "
        f"{result['decode_tps_1']} tok/s (accept length {result['accept_length']}, random weights), "
        f"8 streams {result['decode_tps_8']} tok/s.",
        "",
    ]
    lines += [
        "The 8 streams run at once only as far as the case's --max-running-requests lets them (the plan's "
        "default asks for 4, the sglang_servers group's target_concurrency); per case figures are in the JSON.",
        "",
    ]
    drain = result.get("drain")
    if drain:
        lines += [
            f"Restart as KillMode=mixed stops a unit, {drain['streams']} streams of {drain['tokens_per_stream']} "
            f"tokens in flight: {drain['cut']} cut (tokens received {drain['tokens']}); the main process exited "
            f"{drain['stop']['main_exit_s']} s after SIGTERM, {drain['stop']['killed_after']} processes left for "
            f"SIGKILL; downtime (old server's last token to new server's first answer) {drain['downtime_s']} s "
            f"against a warm start of {drain['warm_start_s']} s "
            f"({drain['downtime_s'] / drain['warm_start_s']:.2f}x). bench/results/restart_drain.json.",
            "",
        ]
    lines += _reported(result)
    for row in result["cases"]:
        if row.get("plan_error"):
            lines += [f"Plan's refusal ({row['name']}): {row['plan_error']}", ""]
    return "\n".join(lines) + "\n"


def _memory_usage(usage: Any) -> Any:
    """``memory_usage`` of ``/server_info`` in one cell: GB figures, CUDA graphs summed (their split
    and the token capacities are in the JSON)."""
    if not isinstance(usage, dict):
        return usage
    parts = []
    for key in ("weight", "kvcache", "graph", "startup_available"):
        value = usage.get(key)
        if isinstance(value, dict):
            value = round(sum(v for v in value.values() if isinstance(v, (int, float))), 3)
        if value is not None:
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def _reported(result: dict[str, Any]) -> list[str]:
    """A newer SGLang's own report per case (the cap it logged, /server_info's internal state,
    decode rates), when the run recorded it; nothing for a 0.5.11 run."""
    rows = [r for r in result["cases"] if "server_state" in r or "capped_message" in r]
    if not rows:
        return []
    lines = [
        "What SGLang reported per case (`max_running_requests=` of its start-up line; the cap it logged; "
        "`/server_info` `internal_states[0]`):",
        "",
        "| case | asked | started with | capped to (mamba slots, slots per request) | "
        "effective_max_running_requests_per_dp | memory_usage (GB) | ready s | 1 stream tok/s | 8 streams tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        state = r.get("server_state") or {}
        usage_text = _memory_usage(state.get("memory_usage"))
        capped = (
            f"{r['capped_to']} ({r['capped_mamba_cache_size']}, {r['capped_slots_per_request']})"
            if "capped_to" in r
            else "-"
        )
        measured = r.get("measured") or {}
        lines.append(
            f"| {r['name']} | {r.get('requested_running')} | {r.get('logged_max_running_requests')} | {capped} | "
            f"{state.get('effective_max_running_requests_per_dp')} | {usage_text} | {r['ready_s']} | "
            f"{(measured.get('single') or {}).get('decode_tps')} | {(measured.get('streams_8') or {}).get('agg_tps')} |"
        )
    lines.append("")
    messages = sorted({r["capped_message"].split("] ", 1)[-1] for r in rows if r.get("capped_message")})
    for message in messages:
        lines += [f"SGLang's cap, verbatim: `{message}`", ""]
    if result.get("versions"):
        lines += [
            "Versions in the venv: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
            "",
        ]
    return lines
