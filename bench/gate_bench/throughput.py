"""Experiment (b): the gate's decode tok/s against a wire proxy and the openai SDK, same server."""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from .common import CLI, ENTRY, PROMPTS, REPO, log
from .servers import PidBackend


def independent_main(args: argparse.Namespace) -> int:
    """Entry point run by the CPU venv's python: an openai SDK client serving JSON lines.

    Reads ``{"messages": [...], "max_tokens": N}`` per line on stdin, streams that chat
    completion with the SDK, answers ``{"completion_tokens", "ttft_s", "decode_tps"}``.
    """
    import httpx
    from openai import OpenAI  # the CPU profile's lock ships it

    # one connection per request (like the gate), so the wire proxy sees each request apart
    http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=300)
    client = OpenAI(base_url=args.url + "/v1", api_key="unused", max_retries=0, http_client=http)
    for line in sys.stdin:
        job = json.loads(line)
        t0 = time.perf_counter()
        times: list[float] = []
        usage = None
        stream = client.chat.completions.create(
            model=args.model,
            messages=job["messages"],
            stream=True,
            max_tokens=job["max_tokens"],
            temperature=0,
            stream_options={"include_usage": True},
        )
        for event in stream:
            now = time.perf_counter()
            if event.choices and event.choices[0].delta and event.choices[0].delta.content:
                times.append(now)
            if getattr(event, "usage", None):
                usage = event.usage
        n = usage.completion_tokens
        tps = (n - 1) / (times[-1] - times[0]) if n > 1 and len(times) > 1 and times[-1] > times[0] else None
        print(json.dumps({"completion_tokens": n, "ttft_s": times[0] - t0, "decode_tps": tps}), flush=True)
    return 0


class WireProxy:
    """A TCP proxy between the gate and the server that timestamps what the server sends.

    It parses the raw bytes itself (HTTP chunked framing, SSE events, usage), so it gives
    a measurement of the gate's very own requests that shares no code with the gate.
    """

    def __init__(self, upstream_port: int) -> None:
        """Listen on a free local port and forward to ``upstream_port``."""
        self.upstream_port = upstream_port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.exchanges: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        """Accept connections until the socket is closed, one thread each."""
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        """Forward one connection both ways, timestamping what the server sends."""
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        ex: dict[str, Any] = {"request": bytearray(), "t_request": 0.0, "segments": []}
        with self.lock:
            self.exchanges.append(ex)

        def forward_request() -> None:
            """Client to server: the request bytes, then half-close."""
            while True:
                data = client.recv(65536)
                if not data:
                    break
                ex["request"] += data
                ex["t_request"] = time.monotonic()
                upstream.sendall(data)
            try:
                upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        thread = threading.Thread(target=forward_request, daemon=True)
        thread.start()
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                ex["segments"].append((time.monotonic(), data))
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                try:
                    sock.close()
                except OSError:
                    pass

    def last_chat(self) -> dict[str, Any] | None:
        """The last exchange that was a chat completion."""
        with self.lock:
            chats = [e for e in self.exchanges if bytes(e["request"][:30]).startswith(b"POST /v1/chat/completions")]
        return chats[-1] if chats else None

    def close(self) -> None:
        """Stop accepting connections."""
        self.sock.close()


def wire_figures(ex: dict[str, Any]) -> dict[str, Any] | None:
    """Decode tok/s and TTFT of one exchange from the raw bytes and their arrival times."""
    raw = b"".join(seg for _, seg in ex["segments"])
    ends, total = [], 0
    for t, seg in ex["segments"]:
        total += len(seg)
        ends.append((total, t))

    def time_at(offset: int) -> float:
        """Arrival of the segment holding raw byte ``offset``."""
        return next(t for end, t in ends if end > offset)

    head_end = raw.find(b"\r\n\r\n") + 4
    chunked = b"transfer-encoding: chunked" in raw[:head_end].lower()
    pieces = []  # (body_start, raw_start, size)
    body = bytearray()
    pos = head_end
    if chunked:
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol].split(b";")[0] or b"0", 16)
            if size == 0:
                break
            pieces.append((len(body), eol + 2, size))
            body += raw[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
    else:
        pieces.append((0, head_end, len(raw) - head_end))
        body += raw[head_end:]

    def raw_offset(body_offset: int) -> int:
        """Where a byte of the de-chunked body lies in the raw stream."""
        for b_start, r_start, size in pieces:
            if b_start <= body_offset < b_start + size:
                return r_start + body_offset - b_start
        return len(raw) - 1

    token_times: list[float] = []
    usage = None
    start = 0
    text = bytes(body)
    while True:
        end = text.find(b"\n\n", start)
        if end < 0:
            break
        for line in text[start:end].split(b"\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    token_times.append(time_at(raw_offset(end + 1)))
        start = end + 2
    if not usage or len(token_times) < 2 or token_times[-1] <= token_times[0]:
        return None
    n = usage["completion_tokens"]
    return {
        "completion_tokens": n,
        "ttft_s": token_times[0] - ex["t_request"],
        "decode_tps": (n - 1) / (token_times[-1] - token_times[0]),
    }


def throughput(
    paths: dict[str, Path], work: Path, rounds: int, requests: int, max_tokens: int, port: int
) -> dict[str, Any]:
    """Gate against the openai SDK, one request each in turn, on one real server."""
    backend = PidBackend(paths, work, sys.executable)
    backend.start("healthy", port)
    url = f"http://127.0.0.1:{port}"
    proxy = WireProxy(port)
    proxy_url = f"http://127.0.0.1:{proxy.port}"
    prompts = json.loads(PROMPTS.read_text())["prompts"]
    sdk = subprocess.Popen(
        [
            str(paths["python"]),
            str(ENTRY),
            "_independent",
            "--url",
            proxy_url,
            "--model",
            str(paths["model"]),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def gate_cli(prompt_file: Path, warmup: int, count: int) -> dict[str, Any]:
        """Run the gate CLI through the proxy; its (passing) report."""
        proc = subprocess.run(
            [
                sys.executable,
                str(CLI),
                "--url",
                proxy_url,
                "--model",
                str(paths["model"]),
                "--prompts",
                str(prompt_file),
                "--warmup",
                str(warmup),
                "--requests",
                str(count),
                "--max-tokens",
                str(max_tokens),
                "--json",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        report = json.loads(proc.stdout)
        if not report.get("passed"):
            raise RuntimeError("gate failed during the throughput bench: {}".format(report.get("reasons")))
        return report

    def sdk_call(prompt: dict[str, Any]) -> dict[str, Any]:
        """One request by the openai SDK client; its own figures."""
        sdk.stdin.write(json.dumps({"messages": prompt["messages"], "max_tokens": max_tokens}) + "\n")
        sdk.stdin.flush()
        line = sdk.stdout.readline()
        if not line:
            raise RuntimeError("the openai SDK client died")
        return json.loads(line)

    samples: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        # the gate as the role runs it (2 warm-up + N measured), which also warms the server up
        batch = gate_cli(PROMPTS, 2, requests)
        log(f"gate batch run: {batch['aggregate']['decode_tps_mean']:.1f} tok/s over {requests} requests")
        for i in range(2):
            sdk_call(prompts[i])  # the SDK's own warm-up, same prompts as the gate's
        one = work / "prompt.json"
        # Clients alternate request by request over consecutive prompts, so neither gets
        # the same prompt twice in a row (transformers serve answers a repeated
        # conversation abnormally fast) and server drift hits both alike; over every two
        # rounds each client sends every prompt once. Both go through the wire proxy.
        for r in range(rounds):
            for k in range(requests):
                prompt = prompts[(2 + k) % len(prompts)]
                who = "gate" if (k + r) % 2 == 0 else "sdk"
                if who == "gate":
                    one.write_text(json.dumps({"prompts": [prompt]}))
                    req = gate_cli(one, 0, 1)["requests"][0]
                    own = {k2: req[k2] for k2 in ("decode_tps", "completion_tokens", "ttft_s")}
                else:
                    own = sdk_call(prompt)
                ex = proxy.last_chat()
                sample = {"round": r + 1, "prompt_id": prompt["id"], "client": who, "own": own}
                sample["wire"] = wire_figures(ex) if ex else None
                samples.append(sample)
                wire = (sample["wire"] or {}).get("decode_tps") or 0
                log(f"round {r + 1} {prompt['id']:<26} {who:<4} {own['decode_tps'] or 0:6.1f} tok/s (wire {wire:6.1f})")
    finally:
        sdk.stdin.close()
        sdk.wait(30)
        proxy.close()
        backend.cleanup()

    def figures(client: str, source: str) -> list[float]:
        """The decode tok/s of ``client``'s requests, by the client (``own``) or the proxy (``wire``)."""
        values = [(x[source] or {}).get("decode_tps") for x in samples if x["client"] == client]
        return [v for v in values if v]

    gate, sdk_own = figures("gate", "own"), figures("sdk", "own")
    gate_wire, sdk_wire = figures("gate", "wire"), figures("sdk", "wire")
    by_prompt: dict[str, dict[str, float]] = {}
    for x in samples:
        if x["own"].get("decode_tps"):
            by_prompt.setdefault(x["prompt_id"], {})[x["client"]] = x["own"]["decode_tps"]
    paired = [v["gate"] / v["sdk"] for v in by_prompt.values() if "gate" in v and "sdk" in v]
    adjacent = []  # each gate request against the SDK request just before or after it
    for a, b in zip(samples, samples[1:], strict=False):
        if {a["client"], b["client"]} == {"gate", "sdk"} and a["own"]["decode_tps"] and b["own"]["decode_tps"]:
            g, c = (a, b) if a["client"] == "gate" else (b, a)
            adjacent.append(g["own"]["decode_tps"] / c["own"]["decode_tps"])
    per_request_wire = [
        x["own"]["decode_tps"] / x["wire"]["decode_tps"]
        for x in samples
        if x["client"] == "gate" and x["own"].get("decode_tps") and (x["wire"] or {}).get("decode_tps")
    ]
    med, avg = statistics.median, statistics.mean
    return {
        # headline: the gate's requests, timed by the gate and, independently, by the wire proxy
        "gate_tps": round(med(gate), 2),
        "independent_tps": round(med(gate_wire), 2),
        "tps_ratio": round(med(gate) / med(gate_wire), 4),
        "tps_ratio_per_request_min": round(min(per_request_wire), 4),
        "tps_ratio_per_request_max": round(max(per_request_wire), 4),
        # a second independent client on its own requests (server drift included)
        "sdk_tps": round(med(sdk_own), 2),
        "sdk_vs_wire_ratio": round(med(sdk_own) / med(sdk_wire), 4) if sdk_wire else None,
        "gate_vs_sdk_ratio": round(med(gate) / med(sdk_own), 3),
        "gate_vs_sdk_ratio_of_means": round(avg(gate) / avg(sdk_own), 3),
        "gate_vs_sdk_adjacent_median": round(med(adjacent), 3) if adjacent else None,
        "gate_vs_sdk_same_prompt_median": round(med(paired), 3) if paired else None,
        "gate_tps_mean": round(avg(gate), 2),
        "sdk_tps_mean": round(avg(sdk_own), 2),
        "decode_tps_range": [round(min(gate + sdk_own), 1), round(max(gate + sdk_own), 1)],
        "requests_per_client": len(gate),
        "same_tokens_as_wire": all(
            x["own"]["completion_tokens"] == (x["wire"] or {}).get("completion_tokens") for x in samples
        ),
        "gate_batch": {
            k: batch["aggregate"][k]
            for k in (
                "decode_tps_mean",
                "decode_tps_median",
                "ttft_p50_s",
                "ttft_p95_s",
                "itl_mean_s",
                "total_tps",
                "tokens_per_chunk",
            )
        },
        "settings": {
            "rounds": rounds,
            "requests_per_round": requests,
            "max_tokens": max_tokens,
            "concurrency": 1,
            "temperature": 0,
            "prompts": str(PROMPTS.relative_to(REPO)),
            "order": "gate and SDK alternate request by request over consecutive prompts; over two rounds "
            "each client sends each prompt once; both through the wire proxy",
        },
        "samples": samples,
    }
