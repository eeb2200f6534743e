"""GPU acceptance on the GPU host: the gate, bench_serving and the seed's original flags."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import (
    BUILTIN_PROMPTS,
    COLLECTIONS,
    EXPECTED_REFUSAL,
    GATE_CLI,
    ORIGINAL_FLAGS,
    REPO,
    AcceptanceError,
    flag_value,
    say,
    write_json,
)
from .device import Device
from .processes import (
    alive,
    base_env,
    http_json,
    port_open,
    start,
    stop_session,
    tail,
)

# --------------------------------------------------------------------------------------
# gate, probe, bench (device)
# --------------------------------------------------------------------------------------


def find_value(data: Any, keys: Iterable[str]) -> Any:
    """The first value under any of ``keys`` in nested dicts/lists (breadth first), else None."""
    keys = list(keys)
    queue = [data]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            for key in keys:
                if key in node and node[key] is not None and not isinstance(node[key], (dict, list)):
                    return node[key]
            queue += list(node.values())
        elif isinstance(node, list):
            queue += node
    return None


def last_json_object(text: str) -> Any:
    """The last top-level JSON object in a command's output (None if there is none)."""
    decoder = json.JSONDecoder()
    found, index = None, text.find("{")
    while index != -1:
        try:
            found, end = decoder.raw_decode(text, index)
            index = text.find("{", end)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
    return found


def builtin_measure(url: str, model: str, output_len: int, prompts: list[str]) -> dict[str, Any]:
    """Fallback while tools/health-gate is absent: streamed greedy chat completions, one at a
    time; decode tok/s per request = (tokens - 1) / (last token time - first token time)."""
    runs = []
    for prompt in prompts[:3]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": output_len,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        request = urllib.request.Request(
            url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        t0, first, last, usage = time.time(), None, None, {}
        with urllib.request.urlopen(request, timeout=300) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                usage = chunk.get("usage") or usage
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    first = first or time.time()
                    last = time.time()
        tokens = int(usage.get("completion_tokens", 0))
        decode = (tokens - 1) / (last - first) if first and last and last > first else None
        runs.append(
            {
                "ttft_s": round((first or t0) - t0, 3),
                "completion_tokens": tokens,
                "prompt_tokens": usage.get("prompt_tokens"),
                "decode_tps": decode,
            }
        )
    rates = [r["decode_tps"] for r in runs if r["decode_tps"]]
    return {
        "source": "gpu-acceptance fallback (tools/health-gate absent)",
        "runs": runs,
        "decode_tps": sum(rates) / len(rates) if rates else None,
        "prompt_tokens": runs[0]["prompt_tokens"] if runs else None,
        "output_len": output_len,
    }


def probe(url: str) -> dict[str, Any]:
    """What SGLang says about itself: /server_info (version, TP, spec, mamba strategy), the
    served model id, and one greedy /generate for the MTP accept length."""
    result: dict[str, Any] = {}
    for path in ("/server_info", "/get_server_info"):
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            info = http_json(url + path)
            keys = (
                "version tp_size speculative_algorithm speculative_num_steps speculative_eagle_topk "
                "speculative_num_draft_tokens mamba_scheduler_strategy attention_backend linear_attn_backend "
                "sampling_backend mem_fraction_static max_running_requests disable_overlap_schedule "
                "cuda_graph_max_bs model_path served_model_name host port"
            ).split()
            result["server_info"] = {k: info.get(k) for k in keys}
            states = info.get("internal_states") or [{}]
            result["avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
            break
    with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
        result["model_id"] = http_json(url + "/v1/models")["data"][0]["id"]
    with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
        answer = http_json(
            url + "/generate",
            {
                "text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
            },
            120,
        )
        meta = answer.get("meta_info", {})
        result["generate"] = {
            k: meta.get(k)
            for k in (
                "prompt_tokens",
                "completion_tokens",
                "spec_verify_ct",
                "spec_accept_length",
                "spec_accept_rate",
                "e2e_latency",
            )
        }
    return result


def cmd_gate(args: argparse.Namespace, dev: Device) -> int:
    """Run our gate CLI against the server (fallback: a plain measurement), then probe SGLang."""
    record, manifest = dev.server(args.name), dev.manifest()
    gate_cli = GATE_CLI
    t0 = time.time()
    info = probe(record["url"])
    if gate_cli.is_file():
        argv = [
            sys.executable,
            str(gate_cli),
            "--url",
            record["url"],
            "--json",
            "--pid",
            str(record["pid"]),
            *manifest.get("gate_args", []),
            *args.gate_args,
        ]
        say(f"gate: {shlex.join(argv[1:])}")
        gate_env = {**base_env(), "PYTHONPATH": str(COLLECTIONS)}
        done = subprocess.run(argv, capture_output=True, text=True, env=gate_env, timeout=args.timeout)
        (dev.logs / f"gate-{args.name}.out").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
        report = last_json_object(done.stdout)
        result = {
            "source": "tools/health-gate",
            "argv": argv[1:],
            "exit": done.returncode,
            "passed": done.returncode == 0,
            "report": report,
        }
        if report is None:
            print(done.stdout[-2000:], done.stderr[-2000:])
    else:
        say("tools/health-gate is missing: measuring with the built-in fallback (gate_passed stays null)")
        bench = manifest["bench"]
        report = builtin_measure(record["url"], info.get("model_id", "default"), bench["output_len"], BUILTIN_PROMPTS)
        result = {"source": report["source"], "exit": None, "passed": None, "report": report}
    result.update(gate_figures(result["report"]))
    result["probe"] = probe(record["url"])
    result["probe_before"] = info
    result["started"] = utc(t0)
    result["seconds"] = round(time.time() - t0, 1)
    state = dev.load()
    state.setdefault("gate", {})[args.name] = result
    write_json(dev.state_path, state)
    say(
        f"gate '{args.name}': passed {result['passed']} (exit {result['exit']}), tps {result['tps']}, "
        f"accept length {result['accept_length']}; server {json.dumps(result['probe'].get('server_info', {}))[:400]}"
    )
    return 0 if result["passed"] in (True, None) else 1


def gate_figures(report: Any) -> dict[str, Any]:
    """The figures the acceptance compares, read from the gate's report (schema 1 of
    the gate's package llm_gate) or, for the built-in fallback, found by name.

    tps: mean of the per-request decode tok/s; prompt_tokens: mean prompt length per
    request (the aggregate holds totals); output_len: the gate's fixed max_tokens.
    """
    if isinstance(report, dict) and isinstance(report.get("aggregate"), dict):
        agg, settings = report["aggregate"], report.get("settings") or {}
        requests = agg.get("requests") or 0
        return {
            "tps": agg.get("decode_tps_mean"),
            "accept_length": (report.get("speculative") or {}).get("accept_length"),
            "prompt_tokens": round(agg["prompt_tokens"] / requests) if requests and agg.get("prompt_tokens") else None,
            "output_len": settings.get("max_tokens"),
        }
    return {
        "tps": find_value(report, ["decode_tps", "tps", "tokens_per_s", "output_tps"]),
        "accept_length": find_value(report, ["accept_length", "spec_accept_length", "avg_spec_accept_length"]),
        "prompt_tokens": find_value(report, ["prompt_tokens", "input_tokens", "prompt_len"]),
        "output_len": find_value(report, ["max_tokens", "output_len"]),
    }


def gate_prompts() -> list[str]:
    """The texts of the gate's own prompts (roles/health_gate/files/prompts.json)."""
    path = REPO / "roles" / "health_gate" / "files" / "prompts.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    items = data.get("prompts", data) if isinstance(data, dict) else data
    texts = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict):
            text = item.get("content") or item.get("prompt") or item.get("text")
            if text is None and isinstance(item.get("messages"), list):
                text = " ".join(str(m.get("content", "")) for m in item["messages"] if isinstance(m, dict))
            if text:
                texts.append(str(text))
    return texts


def bench_dataset(path: Path, prompts: list[str]) -> None:
    """A ShareGPT-format file of the prompts, so ``--dataset-name random`` reads it instead of
    downloading ShareGPT (the device has no network)."""
    rows = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "ok"}]} for p in prompts]
    path.write_text(json.dumps(rows))


def utc(timestamp: float) -> str:
    """ISO 8601 UTC time of a Unix timestamp."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def record_bench(dev: Device, name: str, result: dict[str, Any]) -> None:
    """Keep a bench_serving result under the server it measured (the gate's are kept alike)."""
    state = dev.load()
    benches = state.get("bench") if isinstance(state.get("bench"), dict) and "argv" not in state["bench"] else {}
    benches[name] = result
    dev.update("bench", benches)


def cmd_bench(args: argparse.Namespace, dev: Device) -> int:
    """python -m sglang.bench_serving against the same server with the gate's lengths."""
    record, manifest, plan = dev.server(args.name), dev.manifest(), dev.plan()
    gate = dev.load().get("gate", {}).get(args.name, {})
    bench = manifest["bench"]
    input_len = int(args.input_len or gate.get("prompt_tokens") or bench["input_len"])
    output_len = int(args.output_len or gate.get("output_len") or bench["output_len"])
    dataset = dev.root / "bench_prompts.json"
    bench_dataset(dataset, gate_prompts() or BUILTIN_PROMPTS)
    out_file = dev.logs / f"bench-{args.name}.jsonl"
    out_file.unlink(missing_ok=True)
    model_id = (gate.get("probe") or {}).get("model_id") or probe(record["url"]).get("model_id") or str(plan.model_path)
    argv = [
        str(plan.venv_dir / "bin" / "python"),
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        record["url"],
        "--model",
        model_id,
        "--tokenizer",
        str(plan.model_path),
        "--dataset-name",
        "random",
        "--dataset-path",
        str(dataset),
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(args.num_prompts or bench["num_prompts"]),
        "--max-concurrency",
        str(bench["max_concurrency"]),
        "--warmup-requests",
        "1",
        "--seed",
        "1",
        "--output-file",
        str(out_file),
    ]
    say(f"bench: {shlex.join(argv[1:])}")
    t0 = time.time()
    log = dev.logs / f"bench-{args.name}.log"
    with log.open("w") as out:
        done = subprocess.run(
            argv, env=base_env(), stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout, cwd=dev.root
        )
    result: dict[str, Any] = {
        "argv": argv[1:],
        "exit": done.returncode,
        "started": utc(t0),
        "seconds": round(time.time() - t0, 1),
        "input_len": input_len,
        "output_len": output_len,
    }
    if done.returncode or not out_file.is_file():
        print(tail(log, 40))
        record_bench(dev, args.name, result)
        raise AcceptanceError(f"bench_serving failed with exit code {done.returncode} (log tail above)")
    row = json.loads(out_file.read_text().strip().splitlines()[-1])
    keys = [
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "output_throughput",
        "mean_tpot_ms",
        "median_tpot_ms",
        "median_itl_ms",
        "mean_ttft_ms",
        "accept_length",
        "duration",
        "max_concurrency",
    ]
    result.update({k: row.get(k) for k in keys})
    tpot = row.get("mean_tpot_ms")
    result["decode_tps"] = round(1000.0 / tpot, 2) if tpot else None
    result["tps_metric"] = bench["tps_metric"]
    result["tps"] = result["decode_tps"] if bench["tps_metric"] == "tpot" else row.get("output_throughput")
    record_bench(dev, args.name, result)
    say(
        f"bench_serving: {result['completed']} requests, output {row.get('output_throughput')} tok/s, "
        f"1000/TPOT {result['decode_tps']} tok/s, accept length {row.get('accept_length')}"
    )
    return 0


# --------------------------------------------------------------------------------------
# original flags (device)
# --------------------------------------------------------------------------------------


def error_line(text: str) -> str | None:
    """The last ``SomethingError: message`` line of a log."""
    found = None
    for line in text.splitlines():
        match = re.match(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", line)
        if match:
            found = f"{match.group(1)}: {match.group(2).strip()}"
    return found


def cmd_original_flags(args: argparse.Namespace, dev: Device) -> int:
    """Run the seed's by-hand launch (no SGLANG_ENABLE_SPEC_V2, no mamba strategy, one draft
    token) against the tiny model and record SGLang's refusal."""
    plan = dev.plan()
    port = int(flag_value(ORIGINAL_FLAGS, "--port") or 30000)
    if port_open(port):
        raise AcceptanceError(f"port {port} is in use; run original-flags before launch (or after stop)")
    argv = [
        str(plan.venv_dir / "bin" / "python3"),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(plan.model_path),
        *ORIGINAL_FLAGS,
    ]
    log = dev.logs / "original-flags.log"
    log.unlink(missing_ok=True)
    say(f"original flags: {shlex.join(argv)}")
    t0 = time.time()
    pid = start(argv, base_env(), log, dev.root / "run")
    while alive(pid) and time.time() - t0 < args.timeout:
        time.sleep(0.5)
    timed_out = alive(pid)
    if timed_out:
        stop_session(pid, grace_s=10)
    text = log.read_text(errors="replace") if log.is_file() else ""
    error = error_line(text)
    result = {
        "argv": argv,
        "seconds": round(time.time() - t0, 1),
        "timed_out": timed_out,
        "error": error,
        "expected": bool(error and EXPECTED_REFUSAL in error),
    }
    dev.update("original_flags", result)
    say(f"original flags ended after {result['seconds']} s: {error}")
    if not result["expected"]:
        print(tail(log, 40))
        raise AcceptanceError("the seed's flags did not end in the expected ValueError (log tail above)")
    return 0
