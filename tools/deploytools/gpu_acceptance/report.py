"""GPU acceptance on the GPU host: collect the results (JSON, Markdown, logs)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

from .common import (
    HEADLINE_KEYS,
    AcceptanceError,
    flag_value,
    say,
    write_json,
)
from .device import Device, device_info
from .processes import (
    excerpt,
    tail,
)

# --------------------------------------------------------------------------------------
# collect (device)
# --------------------------------------------------------------------------------------


def summarize(state: dict[str, Any], manifest: dict[str, Any] | None) -> dict[str, Any]:
    """The results JSON (bench/results/gpu_acceptance.json) from the recorded state."""
    servers = state.get("servers", {})
    cold, warm = servers.get("cold", {}), servers.get("warm", {})
    gates = state.get("gate", {})
    gate, gate_warm = gates.get("cold", {}), gates.get("warm", {})
    probe_ = gate.get("probe") or gate_warm.get("probe") or {}
    info = probe_.get("server_info") or {}
    benches = state.get("bench", {})
    imports = state.get("install", {}).get("import", {})
    accept = (
        gate.get("accept_length")
        or probe_.get("avg_spec_accept_length")
        or (probe_.get("generate") or {}).get("spec_accept_length")
    )
    # The gate and bench_serving compared on the same server, measured back to back.
    pairs = {
        name: {
            "gate_tps": gates[name].get("tps"),
            "bench_serving_tps": benches[name].get("tps"),
            "gate_at": gates[name].get("started"),
            "bench_at": benches[name].get("started"),
            "ratio": round(gates[name]["tps"] / benches[name]["tps"], 3)
            if gates[name].get("tps") and benches[name].get("tps")
            else None,
        }
        for name in ("cold", "warm")
        if name in gates and name in benches
    }
    headline = next((pairs[n] | {"server": n} for n in ("warm", "cold") if n in pairs and pairs[n]["ratio"]), {})
    bench = benches.get(headline.get("server"), {})
    plan_argv = (manifest or {}).get("plan", {}).get("argv", [])
    answers = {name: correctness_summary(g) for name, g in gates.items()}
    return {
        "launched": cold.get("ready_s") is not None,
        "ready_s": cold.get("ready_s"),
        # True only when every gate run passed; None when no run had a verdict (built-in fallback).
        "gate_passed": None
        if not gates or any(g.get("passed") is None for g in gates.values())
        else all(g["passed"] for g in gates.values()),
        "gate_source": gate.get("source"),
        "gate_tps": headline.get("gate_tps"),
        # The share of the probe set's eval questions the first gated server answered right (None: no eval ran).
        "eval_score": next((a["eval"]["score"] for a in answers.values() if a.get("eval")), None),
        "accept_length": accept,
        "sglang_version": info.get("version") or imports.get("sglang"),
        "tp_size": info.get("tp_size"),
        "speculative_algorithm": info.get("speculative_algorithm"),
        "speculative_algorithm_requested": flag_value(plan_argv, "--speculative-algorithm"),
        "mamba_scheduler_strategy": info.get("mamba_scheduler_strategy"),
        "original_flags_error": state.get("original_flags", {}).get("error"),
        "bench_serving_tps": headline.get("bench_serving_tps"),
        "bench_serving_metric": bench.get("tps_metric"),
        "tps_ratio": headline.get("ratio"),
        "tps_ratio_server": headline.get("server"),
        "tps_pairs": pairs,
        "cold_ready_s": cold.get("ready_s"),
        "warm_ready_s": warm.get("ready_s"),
        "warm_gate_passed": gate_warm.get("passed"),
        "server_info": info,
        "generate_probe": probe_.get("generate"),
        "gate": {
            name: {k: v for k, v in g.items() if k not in ("probe", "probe_before", "report")}
            | {"correctness": answers[name]}
            for name, g in gates.items()
        },
        "bench_serving": benches,
        "original_flags": state.get("original_flags"),
        "install": state.get("install"),
        "plan": (manifest or {}).get("plan"),
        "plan_source": (manifest or {}).get("plan_source"),
        "device_env_added": cold.get("device_env_added"),
        "jit_caches_after_cold": state.get("jit_caches_after_cold"),
        "stop_cold": cold.get("stop"),
        # The GPUs as check found them on the GPU host (a report rendered again elsewhere keeps them).
        "device": {**device_info(), **{k: v for k, v in state.get("check", {}).items() if k in ("gpus", "python")}},
        "notes": notes(manifest, plan_argv),
    }


def correctness_summary(gate: dict[str, Any]) -> dict[str, Any]:
    """What a gate's correctness probe found, in short: the eval's count, the golden and consistency prompts."""
    found = (gate.get("report") or {}).get("correctness") or {}
    if not found:
        return {}
    return {
        "eval": {k: found["eval"][k] for k in ("correct", "count", "score") if k in found["eval"]}
        if found.get("eval")
        else None,
        "golden_prompts": len(found.get("golden") or {}),
        "consistency_prompts": len(found.get("consistency") or []),
    }


def notes(manifest: dict[str, Any] | None, plan_argv: list[str]) -> list[str]:
    """The report's notes: what the model is (trained and carried, or random weights) and the plan's one allowance."""
    carried = ((manifest or {}).get("model") or {}).get("carried")
    fraction = flag_value(plan_argv, "--mem-fraction-static")
    return [
        "The model was carried (prepare --model: e.g. the acceptance model trained with make-tiny-model --train), "
        "so the eval and the MTP head's drafts are its own; the accept length is SGLang's lifetime average."
        if carried
        else "The weights are random (make-tiny-model), so the eval scores about 0 and the accept length is "
        "about 1.0 (every verify step keeps one token); both are reported, not tuned.",
        f"--mem-fraction-static {fraction} is the tiny-model allowance (docs/gpu.md: the draft's KV pool); every "
        "other flag and variable is the plan's."
        if fraction
        else "The plan sets no --mem-fraction-static; every flag and variable is the plan's.",
        "speculative_algorithm is what SGLang reports: NEXTN is rewritten to EAGLE internally.",
    ]


def gpus_title(device: dict[str, Any]) -> str:
    """``2x NVIDIA H200`` from device_info()'s ``gpus`` (nvidia-smi's "name, driver, memory" lines).

    >>> gpus_title({"gpus": ["NVIDIA H200, 580.159.04, 143771 MiB"] * 2})
    '2x NVIDIA H200'
    >>> gpus_title({})
    'an unknown GPU host'
    """
    names = [line.split(",")[0].strip() for line in device.get("gpus") or []]
    if not names:
        return "an unknown GPU host"
    return " + ".join(f"{names.count(name)}x {name}" for name in dict.fromkeys(names))


def markdown(summary: dict[str, Any], dev: Device) -> str:
    """gpu_acceptance.md: the headline numbers and the log excerpts that matter."""
    keys = HEADLINE_KEYS
    lines = [
        f"# GPU acceptance: real SGLang from our launch plan on {gpus_title(summary.get('device') or {})}",
        "",
        "| key | value |",
        "| --- | --- |",
        *(f"| {k} | {summary.get(k)} |" for k in keys),
        "",
        f"Original flags: `{summary.get('original_flags_error')}`",
        "",
        "Launch (the plan's argv):",
        "",
        "```",
        shlex.join((summary.get("plan") or {}).get("argv", [])),
        "```",
        "",
    ]
    for note in summary["notes"]:
        lines.append(f"- {note}")
    for name in ("cold", "warm"):
        picked = excerpt(dev.logs / f"server-{name}.log")
        if picked:
            lines += ["", f"## Server log excerpts ({name} start)", "", "```", *picked, "```"]
    pairs = summary.get("tps_pairs") or {}
    if pairs:
        lines += [
            "",
            "## Gate vs bench_serving, per server (measured back to back)",
            "",
            "| server | gate started | gate tok/s | bench started | bench_serving tok/s | ratio |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {n} | {p['gate_at']} | {p['gate_tps']} | {p['bench_at']} | {p['bench_serving_tps']} | "
                f"{p['ratio']} |"
                for n, p in pairs.items()
            ),
        ]
    for name in pairs:
        bench_log = dev.logs / f"bench-{name}.log"
        if bench_log.is_file():
            lines += ["", f"## bench_serving ({name})", "", "```", tail(bench_log, 30), "```"]
    return "\n".join(lines) + "\n"


def cmd_collect(args: argparse.Namespace, dev: Device) -> int:
    """Write gpu_acceptance.json, gpu_acceptance.md and logs.tar.gz to ``--out`` (default
    ``<state>/out``; 3 files, flat)."""
    out = Path(getattr(args, "out", None) or dev.root / "out")
    out.mkdir(parents=True, exist_ok=True)
    manifest = None
    with contextlib.suppress(AcceptanceError):
        manifest = dev.manifest()
    state = dev.load()
    summary = summarize(state, manifest)
    write_json(out / "gpu_acceptance.json", summary)
    (out / "gpu_acceptance.md").write_text(markdown(summary, dev))
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for path in sorted(dev.logs.iterdir()) + [dev.state_path]:
            if path.is_file():
                data = path.read_bytes()[-4 * 2**20 :]
                info = tarfile.TarInfo(f"logs/{path.name}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
    headline = {k: summary[k] for k in HEADLINE_KEYS}
    say("summary " + json.dumps(headline))
    say(f"original_flags_error: {summary['original_flags_error']}")
    say(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    return 0
