# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Streaming: one timed chat completion, and N of them at a set concurrency."""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .client import BODY_QUOTE_CHARS, Endpoint, quote_body
from .errors import RequestError
from .monitor import Monitor
from .stats import decode_tps, mean_of, percentile, rounded

CHAT_PATH = "/v1/chat/completions"

# How each engine is asked for exactly ``max_tokens`` tokens (no early stop at EOS or a stop token),
# so that every request, every gate and every engine version decodes the same number of tokens:
# SGLang's OpenAI endpoint takes ``ignore_eos`` (it skips every stop-token check; ``min_tokens``
# would add a penalizer to each step); ``transformers serve`` refuses unknown fields with HTTP 422
# but takes a ``generation_config`` JSON string, whose ``min_new_tokens`` masks EOS until then.
# Other engines get the plain request (their outputs may stop early; the report says so).
FIXED_OUTPUT = {"sglang": "ignore_eos", "transformers": "min_new_tokens"}


def fixed_output_fields(engine: str, max_tokens: int) -> tuple[str | None, dict[str, Any]]:
    """(the method's name or None, the request fields) that make ``engine`` decode exactly ``max_tokens``."""
    method = FIXED_OUTPUT.get(engine)
    if method == "ignore_eos":
        return method, {"ignore_eos": True}
    if method == "min_new_tokens":
        return method, {"generation_config": json.dumps({"min_new_tokens": int(max_tokens)})}
    return None, {}


class RequestResult:
    """Timings and token counts of one streamed chat completion."""

    def __init__(self, index: int, prompt_id: str) -> None:
        """An empty result for request ``index`` on prompt ``prompt_id``."""
        self.index = index
        self.prompt_id = prompt_id
        self.started_s = 0.0
        self.ttft_s = 0.0
        self.e2e_s = 0.0
        self.decode_s = 0.0
        self.decode_tps: float | None = None
        self.completion_tokens = 0
        self.prompt_tokens = 0
        self.content_chunks = 0
        self.finish_reason: str | None = None
        self.gaps: list[float] = []

    def as_dict(self) -> dict[str, Any]:
        """Per-request figures for the report."""
        return {
            "index": self.index,
            "prompt_id": self.prompt_id,
            "started_s": rounded(self.started_s, 3),
            "ttft_s": rounded(self.ttft_s),
            "decode_s": rounded(self.decode_s),
            "decode_tps": rounded(self.decode_tps, 3),
            "itl_mean_s": rounded(mean_of(self.gaps), 5),
            "itl_p95_s": rounded(percentile(self.gaps, 95), 5),
            "e2e_s": rounded(self.e2e_s),
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "content_chunks": self.content_chunks,
            "finish_reason": self.finish_reason,
        }


def _has_token(delta: dict[str, Any]) -> bool:
    """Does a stream delta carry generated text (content, reasoning or a tool call)?"""
    for key in ("content", "reasoning_content", "reasoning"):
        if isinstance(delta.get(key), str) and delta.get(key):
            return True
    return bool(delta.get("tool_calls"))


def stream_chat(
    endpoint: Endpoint,
    model: str,
    prompt: dict[str, Any],
    max_tokens: int,
    timeout_s: float,
    index: int = 0,
    t_zero: float | None = None,
    register: Callable[[http.client.HTTPConnection], None] | None = None,
    extra: dict[str, Any] | None = None,
) -> RequestResult:
    """Send one streaming chat completion and time it; raise :class:`RequestError`.

    ``extra`` fields are added to the request body (:func:`fixed_output_fields`).

    ``timeout_s`` bounds both silence on the socket (a stalled stream) and the whole
    request. A stream that ends without ``finish_reason``/``[DONE]`` was dropped; one
    without ``usage`` cannot be measured (the gate never counts chunks as tokens).
    """
    result = RequestResult(index, prompt["id"])
    payload = {
        "model": model,
        "messages": prompt["messages"],
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
    }
    payload.update(extra or {})
    conn = endpoint.connect(timeout_s)
    if register:
        register(conn)
    token_times: list[float] = []
    # When the finish chunk came: the end of decoding, also for tokens after the last content chunk that carry
    # no text (usage counts them; ending at the last content chunk made such a stream look thousands of times
    # faster than it was).
    finished_at: float | None = None
    usage: dict[str, Any] | None = None
    done = False
    what = f"request {index} ({prompt['id']})"
    t0 = time.monotonic()
    result.started_s = t0 - (t_zero if t_zero is not None else t0)
    try:
        conn.request(
            "POST",
            endpoint.prefix + CHAT_PATH,
            body=json.dumps(payload).encode("utf-8"),
            headers=endpoint.headers({"Content-Type": "application/json", "Accept": "text/event-stream"}),
        )
        response = conn.getresponse()
        if response.status != 200:
            raise RequestError(
                f"{what}: HTTP {response.status} {response.reason} from POST {CHAT_PATH}: {quote_body(response.read())}"
            )
        while True:
            raw = response.readline()
            now = time.monotonic()
            if not raw:
                break
            if now - t0 > timeout_s:
                raise RequestError(
                    f"{what} took longer than request_timeout_s ({timeout_s:.0f} s) "
                    f"after {len(token_times)} content chunks"
                )
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" lines
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data.decode("utf-8"))
            except ValueError as exc:
                raise RequestError(f"{what}: unparseable stream line: {quote_body(data, 300)}") from exc
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error"):
                raise RequestError(
                    f"{what}: the server reported an error in the stream: "
                    f"{json.dumps(chunk['error'])[:BODY_QUOTE_CHARS]}"
                )
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                if _has_token(choice.get("delta") or {}):
                    token_times.append(now)
                if choice.get("finish_reason"):
                    result.finish_reason = str(choice["finish_reason"])
                    finished_at = finished_at or now
        t_end = time.monotonic()
    except (socket.timeout, TimeoutError) as exc:  # noqa: UP041 - two classes before Python 3.10
        raise RequestError(
            f"{what} stalled: no data for {timeout_s:.0f} s (request_timeout_s) after {len(token_times)} content chunks"
        ) from exc
    except ConnectionRefusedError as exc:
        raise RequestError(f"{what}: connection refused ({exc})") from exc
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError) as exc:
        raise RequestError(
            f"{what}: stream dropped after {len(token_times)} content chunks ({type(exc).__name__}: {exc})"
        ) from exc
    except (http.client.HTTPException, OSError) as exc:
        raise RequestError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
    if not done and result.finish_reason is None:
        raise RequestError(
            f"{what}: stream dropped: it ended after {len(token_times)} content chunks without a "
            "finish_reason or [DONE]"
        )
    if usage is None or not isinstance(usage.get("completion_tokens"), int):
        raise RequestError(
            f"{what}: the server sent no usage.completion_tokens in the stream; the gate counts "
            "tokens from the server's usage, never from chunks (SGLang and vLLM send it "
            "with stream_options.include_usage)"
        )
    if not token_times:
        raise RequestError(
            "{}: the stream carried no content (usage says {} completion tokens)".format(
                what, usage.get("completion_tokens")
            )
        )
    result.completion_tokens = int(usage["completion_tokens"])
    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    result.content_chunks = len(token_times)
    result.ttft_s = token_times[0] - t0
    result.e2e_s = t_end - t0
    decode_end = max(token_times[-1], finished_at or token_times[-1])
    result.decode_s = decode_end - token_times[0]
    result.decode_tps = decode_tps(result.completion_tokens, token_times[0], decode_end)
    result.gaps = [b - a for a, b in zip(token_times, token_times[1:])]  # noqa: B905 - no strict= before 3.10
    return result


def run_requests(
    endpoint: Endpoint,
    model: str,
    prompts: list[dict[str, Any]],
    count: int,
    concurrency: int,
    max_tokens: int,
    timeout_s: float,
    monitor: Monitor,
    first_index: int = 0,
    extra: dict[str, Any] | None = None,
) -> tuple[list[RequestResult], float]:
    """Run ``count`` requests, ``concurrency`` at a time; (results in order, wall seconds).

    Request ``i`` sends prompt ``first_index + i`` (round-robin) with the body fields ``extra``.

    The first failed request stops the run; the watcher is asked first, so a server that
    died is reported as such.
    """
    jobs: queue.Queue[int] = queue.Queue()
    for i in range(count):
        jobs.put(i)
    results: dict[int, RequestResult] = {}
    errors: list[BaseException] = []
    conns: list[http.client.HTTPConnection] = []
    lock = threading.Lock()
    t_zero = time.monotonic()

    def register(conn: http.client.HTTPConnection) -> None:
        """Keep the connection, to close it if the run is cut short."""
        with lock:
            conns.append(conn)

    def worker() -> None:
        """Take jobs off the queue until it is empty or a request failed."""
        while not errors:
            try:
                i = jobs.get_nowait()
            except queue.Empty:
                return
            prompt = prompts[(first_index + i) % len(prompts)]
            try:
                res = stream_chat(
                    endpoint, model, prompt, max_tokens, timeout_s, first_index + i, t_zero, register, extra
                )
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                with lock:
                    errors.append(exc)
                return
            with lock:
                results[i] = res

    threads = [
        threading.Thread(target=worker, name=f"health-gate-req-{n}", daemon=True)
        for n in range(max(1, min(concurrency, count)))
    ]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            monitor.wait(0.05)
            if errors:
                break
        if errors:
            monitor.poll_now()
            monitor.check()
            raise errors[0]
    finally:
        if errors or monitor.failure is not None:
            with lock:
                for conn in conns:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - best effort
                        pass
    wall = time.monotonic() - t_zero
    return [results[i] for i in sorted(results)], wall
