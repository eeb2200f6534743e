"""A stand-in for SGLang's native API with a toy language model, for the correctness probe's SGLang path.

Real SGLang cannot run on the CI machine's CPU, so the probe's SGLang calls (``/tokenize``,
``/generate`` with token ids and log-probabilities, teacher forcing through ``logprob_start_len``,
``/flush_cache`` with the admin key, cached tokens) are proven against this server, which answers
them in SGLang 0.5.11's shapes (read from its source: ``input_token_logprobs`` starts with a
``None`` for the first position asked, ``output_top_logprobs`` holds ``[logprob, id, text]``
triples). Its model is a toy: bytes are tokens, and the log-probabilities of the next byte are a
seeded function of the last two and of the sum of all, so greedy output is deterministic and every fault is a choice:

``mode``: ``ok``; ``near_tie`` (a small perturbation of every logit, 0.03: flips only near-ties,
little drift, like a kernel change); ``broken`` (a large one: a broken server); ``cache_bug`` (the
``ok`` model, except that a request whose prompt is found in the prefix cache decodes from
perturbed state, like the mamba radix cache's "ghost node"); ``nondeterministic`` (fresh noise on
every request); ``wrong_answers`` (chat answers off by one); ``no_tokenize`` (``/tokenize`` answers
404); ``no_token_ids`` (``/generate`` answers text without token ids or log-probabilities);
``zero_logprobs`` (every log-probability 0); ``busy`` (clients' requests in flight:
``/flush_cache`` answers 400, as SGLang does, unless asked to wait for idle with ``?timeout=S``);
``always_busy`` (clients keep it busy: ``/flush_cache`` answers 400 "Timed out waiting for idle
state." even when asked to wait, as SGLang 0.5.11 did with 8 clients sending all along);
``no_cache`` (no prefix cache: no cached tokens); ``hit_first_token`` (the first decode step is a
near-tie, and a cache hit takes the third-ranked token there, not the runner-up: the class of
sglang #29633); ``batch_flip`` (every other request flips the first near-tie it decodes, as a
batch of other clients' requests can). The chat endpoint answers the questions of the role's probe
sets (their generated evals, looked up; others by parsing them), and off by one those listed in
``wrong`` (a server that lost some of its answers).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import threading
from pathlib import Path
from typing import Any

from fake_http import BackgroundServer, JSONHandler

VOCAB = 128
PROBES = Path(__file__).resolve().parents[2] / "roles" / "health_gate" / "files" / "probes"


def known_answers() -> dict[str, int]:
    """The exact answer of every generated eval question of the role's probe sets, by its text: from
    ``known_answers.json`` beside this file where there is one (a copy in a fake bundle), else worked
    out by the gate's package ({} where it is not at hand)."""
    beside = Path(__file__).with_name("known_answers.json")
    if beside.is_file():
        return {str(k): int(v) for k, v in json.loads(beside.read_text()).items()}
    try:
        from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate import load_probe_set
    except ImportError:
        return {}
    return {
        item["messages"][-1]["content"]: int(item["answer"])
        for path in sorted(PROBES.glob("*.json"))
        for item in load_probe_set(str(path))["eval_items"]
    }


KNOWN = known_answers()


def _logprobs(context: list[int], noise: float = 0.0, rng: random.Random | None = None) -> list[float]:
    """The toy model's log-probabilities of the next byte after ``context`` (seeded by its last two bytes
    and a digest of all of it, so that an earlier turn's text changes a later turn's output)."""
    key = hashlib.sha256(bytes(context[-2:]) + bytes([sum(context) % 256]) + b"toy").digest()
    seeded = random.Random(key)
    logits = [seeded.gauss(0.0, 2.0) for _ in range(VOCAB)]
    if noise:
        jitter = rng or random.Random(hashlib.sha256(bytes(context[-3:]) + b"noise").digest())
        logits = [x + jitter.gauss(0.0, noise) for x in logits]
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    return [x - norm for x in logits]


def _answer(question: str) -> int | None:
    """The exact answer of one of the probe set's generated questions, None when not one."""
    if question in KNOWN:
        return KNOWN[question]
    numbers = [int(n) for n in re.findall(r"\d+", question)]
    if len(numbers) < 2 and "after" in question and numbers:
        return numbers[0] + 1
    if len(numbers) < 2:
        return None
    a, b = numbers[0], numbers[1]
    if " times " in question:
        return a * b
    if " - " in question or "away" in question:
        return a - b
    return a + b


class ToyLM:
    """The toy model and its prefix cache, without a server: what ``/tokenize``, ``/generate``,
    ``/flush_cache`` and the chat answers compute (also installed as a stand-in SGLang by
    tests/tools/test_gpu_tools.py's fake bundle)."""

    def __init__(self, mode: str = "ok") -> None:
        """A model whose faults are ``mode`` (the module's docstring)."""
        self.mode = mode
        self.cache: list[list[int]] = []
        self.lock = threading.Lock()
        self.random = random.Random(7)
        self.wrong: set[str] = set()
        self.requests = 0

    def flush(self) -> None:
        """``/flush_cache``."""
        with self.lock:
            self.cache.clear()

    def tokenize(self, prompt: str) -> list[int]:
        """``/tokenize``: bytes are tokens."""
        return list(prompt.encode())

    def chat(self, question: str) -> str:
        """A chat answer to one of the probe's generated questions."""
        value = _answer(question)
        if value is not None and (self.mode == "wrong_answers" or question in self.wrong):
            value += 1
        return "I do not know" if value is None else str(value)

    def _cached(self, ids: list[int]) -> int:
        """The longest prefix of ``ids`` (at most all but one) that an earlier sequence since the flush shares."""
        best = 0
        for seq in [] if self.mode == "no_cache" else self.cache:
            n = 0
            while n < min(len(seq), len(ids) - 1) and seq[n] == ids[n]:
                n += 1
            best = max(best, n)
        return best

    def _dist(self, context: list[int], hit: bool, rng: random.Random) -> list[float]:
        """The next-byte log-probabilities as this server's ``mode`` computes them."""
        noise = {"near_tie": 0.03, "broken": 3.0}.get(self.mode, 0.0)
        if self.mode == "cache_bug" and hit:
            noise = 3.0
        if self.mode == "nondeterministic":
            return _logprobs(context, 0.5, rng)
        return _logprobs(context, noise)

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/generate``: greedy decoding of ``max_new_tokens``, with SGLang's logprob fields."""
        ids = list(body.get("input_ids") or body.get("text", "").encode())
        params = body.get("sampling_params") or {}
        with self.lock:
            cached = self._cached(ids)
            rng = random.Random(self.random.random())
            self.requests += 1
            flip = self.mode == "batch_flip" and self.requests % 2 == 0
        hit = cached > 0
        top_n = int(body.get("top_logprobs_num") or 0)
        start = body.get("logprob_start_len", -1)
        meta: dict[str, Any] = {"prompt_tokens": len(ids), "cached_tokens": cached}
        if body.get("return_logprob") and start is not None and start >= 0:
            values: list[Any] = [None]
            tops: list[Any] = [None]
            for pos in range(start + 1, len(ids)):
                dist = self._dist(ids[:pos], hit, rng)
                values.append(dist[ids[pos]])
                best = sorted(range(VOCAB), key=lambda t: -dist[t])[:top_n]
                tops.append([[dist[t], t, None] for t in best])
            meta["input_token_logprobs"] = [[v, t, None] for v, t in zip(values, ids[start:])]  # noqa: B905
            meta["input_top_logprobs"] = tops
        out: list[int] = []
        chosen, out_tops = [], []
        for step in range(int(params.get("max_new_tokens", 16))):
            dist = self._dist(ids + out, hit, rng)
            ranked = sorted(range(VOCAB), key=lambda t: -dist[t])
            if self.mode == "hit_first_token" and step == 0:
                dist[ranked[1]] = dist[ranked[0]] - 0.1  # a near-tie at the first token
                ranked = ranked[2:3] + ranked[:2] + ranked[3:] if hit else ranked
            elif flip and dist[ranked[0]] - dist[ranked[1]] <= 0.15:
                dist[ranked[1]] = dist[ranked[0]] + 0.01  # the runner-up by a hair, this once
                ranked = [ranked[1], ranked[0], *ranked[2:]]
                flip = False
            out.append(ranked[0])
            chosen.append([dist[ranked[0]], ranked[0], None])
            out_tops.append([[dist[t], t, None] for t in ranked[:top_n]])
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = chosen
            meta["output_top_logprobs"] = out_tops
        with self.lock:
            self.cache.append(ids + out)
        meta["completion_tokens"] = len(out)
        if self.mode == "zero_logprobs":
            for key in ("output_token_logprobs", "input_token_logprobs"):
                meta[key] = [[None if e[0] is None else 0.0, *e[1:]] for e in meta.get(key) or []]
        if self.mode == "no_token_ids":
            return {
                "text": bytes(out).decode("latin-1"),
                "meta_info": {"prompt_tokens": len(ids), "cached_tokens": cached},
            }
        return {"text": bytes(out).decode("latin-1"), "output_ids": out, "meta_info": meta}


class FakeSGLangLM(BackgroundServer):
    """A threaded HTTP server with SGLang's probe endpoints over a :class:`ToyLM`; ``mode`` may change any time."""

    def __init__(self, mode: str = "ok", api_key: str | None = None, admin_api_key: str | None = None) -> None:
        """Serve on a free port of 127.0.0.1 (``start``)."""
        self.lm = ToyLM(mode)
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.calls: list[tuple[str, dict[str, Any]]] = []
        server = self

        class Handler(JSONHandler):
            def _allowed(self, admin: bool) -> bool:
                """SGLang's auth: the API key on normal endpoints; the admin key (else the API key) on admin ones."""
                wanted = (server.admin_api_key or server.api_key) if admin else server.api_key
                return not wanted or self.headers.get("Authorization") == f"Bearer {wanted}"

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path == "/health":
                    self._json(200, {})
                elif not self._allowed(False):
                    self._json(401, {"error": "Unauthorized"})
                elif self.path == "/v1/models":
                    self._json(200, {"data": [{"id": "toy"}]})
                else:
                    self._json(404, {"detail": "Not Found"})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                self.path, _, query = self.path.partition("?")
                with server.lm.lock:
                    server.calls.append((self.path, body))
                if not self._allowed(self.path == "/flush_cache"):
                    self._json(401, {"error": "Unauthorized"})
                elif self.path == "/flush_cache" and server.lm.mode == "busy" and "timeout=" not in query:
                    self.send_response(400)
                    self.send_header("Content-Length", "18")
                    self.end_headers()
                    self.wfile.write(b"Flush cache failed")
                elif self.path == "/flush_cache" and server.lm.mode == "always_busy":
                    self.send_response(400)
                    self.send_header("Content-Length", "32")
                    self.end_headers()
                    self.wfile.write(b"Timed out waiting for idle state.")
                elif self.path == "/flush_cache":
                    server.lm.flush()
                    self._json(200, {})
                elif self.path == "/tokenize" and server.lm.mode == "no_tokenize":
                    self._json(404, {"detail": "Not Found"})
                elif self.path == "/tokenize":
                    tokens = server.lm.tokenize(body["prompt"])
                    self._json(200, {"tokens": tokens, "count": len(tokens)})
                elif self.path == "/generate":
                    self._json(200, server.lm.generate(body))
                elif self.path == "/v1/chat/completions" and body.get("stream"):
                    self._stream(int(body.get("max_tokens") or 8))
                elif self.path == "/v1/chat/completions":
                    text = server.lm.chat(body["messages"][-1]["content"])
                    self._json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
                else:
                    self._json(404, {"detail": "Not Found"})

            def _stream(self, tokens: int) -> None:
                """A streamed chat completion of ``tokens`` chunks, with usage (the gate's speed measurement)."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                piece = json.dumps({"choices": [{"index": 0, "delta": {"content": "tok "}}]}).encode()
                for _ in range(tokens):
                    self.wfile.write(b"data: " + piece + b"\n\n")
                usage = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}
                end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": usage}
                self.wfile.write(b"data: " + json.dumps(end).encode() + b"\n\ndata: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

        super().__init__(Handler)

    @property
    def mode(self) -> str:
        """The toy model's faults (the module's docstring)."""
        return self.lm.mode

    @mode.setter
    def mode(self, value: str) -> None:
        self.lm.mode = value
