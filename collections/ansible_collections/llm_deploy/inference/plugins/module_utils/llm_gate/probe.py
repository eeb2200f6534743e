# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The correctness probe's requests: golden outputs, cache hit against miss, the eval (what the server says).

:func:`run_probe` asks the server, in order:

1. **Flush** the prefix cache where the engine has one and lets us (SGLang ``/flush_cache``,
   with the admin key when there is one), so that the golden pass starts with misses. SGLang
   flushes only an idle server: under clients' traffic it may not, and the gate notes it.
2. **Golden pass**: each golden prompt of the probe set (:mod:`.probeset`), greedy, exactly
   ``golden.max_tokens`` tokens (SGLang ``ignore_eos``, transformers serve ``min_new_tokens``).
   Later suffixes of a shared prefix and later turns of a conversation hit the cache.
3. **Consistency**: each consistency item asked as a miss, then again (now a cache hit) and once
   more (a repeat in the same cache state). With a prefix cache the three asks start with a marker
   of their own (:func:`fresh_prompt`), so that the first is a miss by construction, whoever else
   asks the server meanwhile (a flush would need an idle server; measured on SGLang 0.5.11 with 8
   clients sending all along, ``/flush_cache?timeout=30`` never found one). Without a prefix
   cache the golden pass's answer is the miss.
4. **Re-scoring** (SGLang only): the reference's tokens, where the last-known-good holds them, fed
   back to this server (teacher forcing, ``/generate`` with ``return_logprob`` from the last prompt
   token), and this server's own golden tokens the same way. The record keeps the second, so that a
   later gate compares the reference's re-score with its own re-score of the same tokens: both
   prefill, the same kernel path (decode-time log-probabilities, recorded in a batch and with
   speculative decoding, come from another).
5. **Eval**: the probe set's generated questions as chat completions (``concurrency`` at a time:
   the gate's ``eval_concurrency``), each reply's first integer against the exact answer.

It returns the raw results; :mod:`.correctness` judges them. Engines: ``sglang`` (native
``/generate``: token ids, log-probabilities, the top two at each step, cached tokens),
``transformers`` (``/v1/completions``, text only, no prefix cache) and ``generic`` (the same,
without a way to ask for exactly ``max_tokens``).
"""

from __future__ import annotations

import json
import secrets
import string
import threading
import time
from collections.abc import Callable
from typing import Any

from .client import Endpoint, quote_body
from .errors import RequestError
from .monitor import Monitor
from .probeset import extract_answer, probe_identity

COMPLETIONS_PATH = "/v1/completions"
LOGPROB_DIGITS = 4
# SGLang flushes its cache only when no request runs or waits: /flush_cache?timeout=S waits up to S
# seconds for that (SGLang 0.5.11 and later), so that clients' requests in flight delay the flush
# instead of failing it.
FLUSH_WAIT_S = 30.0
# How many markers a consistency prompt's miss may take to find one that the cache shares nothing of
# (a marker's first token may match an earlier request's, a partial hit that is no miss).
MISS_TRIES = 6


def _post(endpoint: Endpoint, path: str, payload: dict[str, Any], timeout: float, what: str) -> Any:
    """POST ``payload`` as JSON; the parsed answer, or :class:`RequestError` quoting the server."""
    try:
        status, body = endpoint.request("POST", path, payload, timeout=timeout)
    except OSError as exc:
        raise RequestError(f"{what}: POST {path} failed: {type(exc).__name__}: {exc}") from exc
    if status != 200:
        raise RequestError(f"{what}: HTTP {status} from POST {path}: {quote_body(body)}")
    try:
        return json.loads(body.decode("utf-8"))
    except ValueError as exc:
        raise RequestError(f"{what}: POST {path} answered no JSON: {quote_body(body, 300)}") from exc


def _rounded(values: list[Any]) -> list[float | None]:
    """Log-probabilities to :data:`LOGPROB_DIGITS` decimals (None stays None)."""
    return [None if v is None else round(float(v), LOGPROB_DIGITS) for v in values]


class Completion(dict):
    """One greedy completion: ``text``, and where the engine tells them ``token_ids``, ``logprobs``
    (of each chosen token), ``margins`` (top-1 minus top-2 log-probability at each step: how near
    a tie the choice was), ``runners_up`` (the top-2 token at each step: what a near-tie flips to)
    and ``cached_tokens`` (prompt tokens the prefix cache served)."""


class EngineCalls:
    """The requests the probe makes, in the form of one engine (:data:`ENGINE_CALLS`)."""

    engine = "generic"
    features: dict[str, bool] = {"token_ids": False, "logprobs": False, "rescore": False, "prefix_cache": False}

    def __init__(self, endpoint: Endpoint, model: str, timeout_s: float, admin_api_key: str | None) -> None:
        """Requests to ``endpoint`` for ``model``, each within ``timeout_s``."""
        self.endpoint = endpoint
        self.model = model
        self.timeout = timeout_s
        self.admin_api_key = admin_api_key

    def flush(self) -> str | None:
        """Empty the prefix cache; a note when it cannot (None when it did, or there is none)."""
        return None

    def complete(self, prompt: str, max_tokens: int, what: str) -> Completion:
        """A greedy completion of the raw text ``prompt``, ``max_tokens`` long where the engine can be told so."""
        payload = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        payload.update(self.exact_length(max_tokens))
        answer = _post(self.endpoint, COMPLETIONS_PATH, payload, self.timeout, what)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("text"), str):
            raise RequestError(f"{what}: POST {COMPLETIONS_PATH} answered no choices[0].text")
        return Completion(text=choices[0]["text"])

    def exact_length(self, max_tokens: int) -> dict[str, Any]:
        """Request fields that make the engine generate exactly ``max_tokens`` tokens ({} when it cannot)."""
        return {}

    def rescore(self, prompt: str, token_ids: list[int], what: str) -> dict[str, Any] | None:
        """The log-probability of each of ``token_ids`` after ``prompt`` under this server, with the
        top-1 log-probability at each position: ``{"logprobs", "top"}``; None where the engine cannot."""
        return None


class GenericCalls(EngineCalls):
    """An OpenAI-compatible server: ``/v1/completions``, text only, its own length."""


class TransformersCalls(EngineCalls):
    """``transformers serve``: ``/v1/completions`` with a ``generation_config`` (it refuses unknown
    fields); exactly ``max_tokens`` through ``min_new_tokens``; no prefix cache (each request is a miss)."""

    engine = "transformers"

    def exact_length(self, max_tokens: int) -> dict[str, Any]:
        """A ``generation_config`` that decodes exactly ``max_tokens`` tokens, greedily."""
        config = {"min_new_tokens": max_tokens, "max_new_tokens": max_tokens, "do_sample": False}
        return {"generation_config": json.dumps(config)}


class SGLangCalls(EngineCalls):
    """SGLang's native API: ``/tokenize``, ``/generate`` with log-probabilities, ``/flush_cache``."""

    engine = "sglang"

    features = {"token_ids": True, "logprobs": True, "rescore": True, "prefix_cache": True}

    def flush(self) -> str | None:
        """``POST /flush_cache`` (an admin endpoint: the admin key when set, else the API key), waiting
        up to :data:`FLUSH_WAIT_S` for the server to be idle (clients' requests in flight)."""
        endpoint = self.endpoint.with_key(self.admin_api_key or self.endpoint.api_key)
        wait = min(FLUSH_WAIT_S, self.timeout)
        try:
            status, body = endpoint.request("POST", f"/flush_cache?timeout={wait:g}", None, timeout=self.timeout + wait)
        except OSError as exc:
            return f"/flush_cache failed ({type(exc).__name__}: {exc}): the golden pass may start with cache hits"
        if status in (401, 403):
            return (
                f"/flush_cache answered HTTP {status} ({quote_body(body, 200)}): the golden pass may start with "
                "cache hits (set health_gate_admin_api_key to the server's admin key)"
            )
        if status != 200:
            return (
                f"/flush_cache answered HTTP {status} ({quote_body(body, 200)}): the server was not idle within "
                f"{wait:g} s (requests of its clients in flight), so the golden pass may start with cache hits"
            )
        return None

    def tokenize(self, prompt: str, what: str) -> list[int]:
        """The token ids the server makes of ``prompt``."""
        answer = _post(self.endpoint, "/tokenize", {"model": self.model, "prompt": prompt}, self.timeout, what)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise RequestError(f"{what}: POST /tokenize answered no list of token ids")
        return tokens

    def complete(self, prompt: str, max_tokens: int, what: str) -> Completion:
        """``/generate`` on the prompt's ids: greedy, ``ignore_eos``, with each step's top two log-probabilities."""
        ids = self.tokenize(prompt, what)
        payload = {
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "logprob_start_len": -1,
        }
        answer = _post(self.endpoint, "/generate", payload, self.timeout, what)
        meta = answer.get("meta_info") or {} if isinstance(answer, dict) else {}
        chosen = meta.get("output_token_logprobs") or []
        token_ids = answer.get("output_ids") or [entry[1] for entry in chosen]
        tops = meta.get("output_top_logprobs") or []
        # An answer without its tokens would compare [] with [] and pass on texts never compared.
        if not token_ids or len(chosen) != len(token_ids):
            raise RequestError(
                f"{what}: POST /generate answered {len(token_ids)} token ids and {len(chosen)} log-probabilities "
                f"for {max_tokens} tokens asked: the server speaks SGLang's API but its outputs cannot be compared"
            )
        pairs = [top if isinstance(top, list) and len(top) >= 2 and None not in (top[0][0], top[1][0]) else None
                 for top in tops]  # fmt: skip
        return Completion(
            text=str(answer.get("text", "")),
            token_ids=[int(t) for t in token_ids],
            logprobs=_rounded([entry[0] for entry in chosen]),
            margins=[None if p is None else round(float(p[0][0]) - float(p[1][0]), LOGPROB_DIGITS) for p in pairs],
            runners_up=[None if p is None or p[1][1] is None else int(p[1][1]) for p in pairs],
            cached_tokens=meta.get("cached_tokens"),
        )

    def rescore(self, prompt: str, token_ids: list[int], what: str) -> dict[str, Any] | None:
        """Teacher forcing: ``/generate`` on prompt + ``token_ids`` with ``logprob_start_len`` at the
        prompt's last token. SGLang gives that first position no log-probability (None) and then one
        per later input token, so the entries after the first line up with ``token_ids``; an answer
        whose entries do not (none, or other tokens) raises :class:`RequestError`."""
        ids = self.tokenize(prompt, what)
        payload = {
            "input_ids": ids + list(token_ids),
            "sampling_params": {"temperature": 0, "max_new_tokens": 1},
            "return_logprob": True,
            "top_logprobs_num": 1,
            "logprob_start_len": max(len(ids) - 1, 0),
        }
        meta = (_post(self.endpoint, "/generate", payload, self.timeout, what) or {}).get("meta_info") or {}
        entries = (meta.get("input_token_logprobs") or [])[1:]
        tops = (meta.get("input_top_logprobs") or [])[1:]
        if [int(e[1]) for e in entries[: len(token_ids)]] != list(token_ids) or len(tops) < len(token_ids):
            raise RequestError(
                f"{what}: POST /generate answered {len(entries)} input log-probabilities whose token ids are not the "
                f"{len(token_ids)} tokens re-scored: the re-score cannot be lined up with the tokens"
            )
        return {
            "logprobs": _rounded([e[0] for e in entries[: len(token_ids)]]),
            "top": _rounded([top[0][0] if top else None for top in tops[: len(token_ids)]]),
        }


ENGINE_CALLS: dict[str, type[EngineCalls]] = {
    "sglang": SGLangCalls,
    "transformers": TransformersCalls,
    "generic": GenericCalls,
}


def prior_of(item: dict[str, Any], reference: dict[str, Any], own: dict[str, str]) -> list[str]:
    """The texts the earlier turns of a conversation got, which turn ``item["turn"]``'s prompt is built on:
    the reference's own ``prior`` for this turn when it has one (the prompt it was recorded with), else
    the reference's texts of those turns, else this run's (no reference)."""
    recorded = (reference.get(item["id"]) or {}).get("prior")
    if isinstance(recorded, list) and len(recorded) == item["turn"] - 1:
        return [str(text) for text in recorded]
    base = item["id"].rsplit("/", 1)[0]
    keys = [f"{base}/{n}" for n in range(1, item["turn"])]
    return [(reference.get(key) or {}).get("text", own.get(key, "")) for key in keys]


def fresh_prompt(prompt: str) -> str:
    """``prompt`` behind a random marker of its own: no earlier request shares more than, by chance, a
    first token with it (:func:`ask_miss` asks anew then), so its first ask is a miss and the next ones hits."""
    return f"{secrets.choice(string.ascii_letters + string.digits)}{secrets.token_hex(8)}: {prompt}"


def ask_miss(calls: EngineCalls, monitor: Monitor, prompt: str, max_tokens: int, name: str) -> tuple[str, Completion]:
    """A cache miss of ``prompt`` behind a fresh marker, and that marked prompt: asked again behind another
    marker (at most :data:`MISS_TRIES` in all) while the server says it served cached tokens for it."""
    for _ in range(MISS_TRIES):
        marked = fresh_prompt(prompt)
        miss = monitor.call(calls.complete, marked, max_tokens, f"consistency {name} (cache miss)")
        if not miss.get("cached_tokens"):
            break
    return marked, miss


def prompt_of(item: dict[str, Any], prior: list[str]) -> str:
    """The prompt of one golden item (:func:`.probeset.golden_prompts`): a conversation's turn k is each
    earlier turn followed by the text it got (``prior``), then turn k."""
    if "prompt" in item:
        return item["prompt"]
    parts = []
    for n, text in enumerate(prior):
        parts += [item["turns"][n], text]
    return "".join(parts) + item["turns"][item["turn"] - 1]


def _ask_eval(calls: EngineCalls, probe: dict[str, Any], concurrency: int, monitor: Monitor) -> list[dict[str, Any]]:
    """Every eval question as a chat completion, ``concurrency`` at a time; one row a question."""
    spec = probe["eval"]
    rows: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    pending = list(enumerate(probe["eval_items"]))

    def worker() -> None:
        """Take questions until none is left or one failed."""
        while not errors:
            with lock:
                if not pending:
                    return
                index, item = pending.pop(0)
            payload = {
                "model": calls.model,
                "messages": item["messages"],
                "max_tokens": int(spec["max_tokens"]),
                "temperature": 0,
                **((spec.get("request") or {}).get(calls.engine) or {}),
            }
            try:
                answer = _post(calls.endpoint, "/v1/chat/completions", payload, calls.timeout, f"eval {item['id']}")
                message = (answer.get("choices") or [{}])[0].get("message") or {}
                reply = str(message.get("content") or "")
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                with lock:
                    errors.append(exc)
                return
            got = extract_answer(reply)
            with lock:
                rows[index] = {"id": item["id"], "answer": item["answer"], "got": got, "reply": reply[:80],
                               "right": got == item["answer"]}  # fmt: skip

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        monitor.wait(0.05)
    if errors:
        monitor.poll_now()
        monitor.check()
        raise errors[0]
    return [rows[i] for i in sorted(rows)]


def run_probe(
    endpoint: Endpoint,
    engine: str,
    model: str,
    probe: dict[str, Any],
    reference: dict[str, Any] | None,
    concurrency: int,
    timeout_s: float,
    monitor: Monitor,
    admin_api_key: str | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Ask the server the probe set (the steps of this module's docstring); the raw results.

    ``reference`` is the last-known-good's golden record (:func:`.correctness.record_of`) when it
    was made with this probe set on this model revision: its texts build the conversations' later
    prompts, and its token ids are re-scored. Raises :class:`RequestError` (a request failed) and
    the monitor's :class:`GateFailure` (the server died).
    """
    started = time.monotonic()
    calls = ENGINE_CALLS.get(engine, GenericCalls)(endpoint, model, timeout_s, admin_api_key)
    max_tokens = int(probe["golden"]["max_tokens"])
    result: dict[str, Any] = {
        "probe": probe_identity(probe),
        "engine": engine,
        "features": dict(calls.features, exact_length=bool(calls.exact_length(max_tokens))),
        "max_tokens": max_tokens,
        "notes": [],
    }
    result["flush_problems"] = []
    note = monitor.call(calls.flush)
    if note:
        result["flush_problems"].append(note)
    golden_ref = (reference or {}).get("golden") or {}
    outputs: dict[str, Completion] = {}
    prompts: dict[str, str] = {}
    for item in probe["golden_prompts"]:
        # A turn is asked on the texts the reference's was asked on, so that both asked the same, and
        # keeps them (its record is then whole by itself, also when this run's outputs replace it).
        prior = prior_of(item, golden_ref, {k: v["text"] for k, v in outputs.items()}) if "turns" in item else None
        prompts[item["id"]] = prompt_of(item, prior or [])
        outputs[item["id"]] = monitor.call(calls.complete, prompts[item["id"]], max_tokens, f"golden {item['id']}")
        if prior is not None:
            outputs[item["id"]]["prior"] = prior
    result["golden"] = {key: dict(value) for key, value in outputs.items()}
    if say:
        say(f"correctness: {len(outputs)} golden prompts, {max_tokens} tokens each")

    consistency = []
    for name in (probe.get("consistency") or {}).get("items") or []:
        # With a prefix cache the prompt gets a marker of its own, so that its first ask is a miss; without
        # one the golden pass's answer was a miss already.
        miss, prompt = outputs[name], prompts[name]
        if calls.features["prefix_cache"]:
            prompt, miss = ask_miss(calls, monitor, prompt, max_tokens, name)
        hit = monitor.call(calls.complete, prompt, max_tokens, f"consistency {name} (cache hit)")
        again = monitor.call(calls.complete, prompt, max_tokens, f"consistency {name} (repeat)")
        consistency.append({"id": name, "miss": dict(miss), "hit": dict(hit), "repeat": dict(again)})
    result["consistency"] = consistency

    # Re-scoring: the reference's tokens under this server, and this server's own tokens (the record
    # keeps those, so that a later gate compares a re-score with a re-score: one kernel path, not two).
    rescored: dict[str, Any] = {}
    own: dict[str, Any] = {}
    if calls.features["rescore"]:
        for key, value in golden_ref.items():
            if key in prompts and value.get("token_ids"):
                rescored[key] = monitor.call(calls.rescore, prompts[key], value["token_ids"], f"re-score {key}")
        for key, value in outputs.items():
            same = key in rescored and (golden_ref.get(key) or {}).get("token_ids") == value["token_ids"]
            own[key] = (
                rescored[key]
                if same
                else monitor.call(calls.rescore, prompts[key], value["token_ids"], f"re-score own {key}")
            )
    result["rescored"] = rescored
    result["self_rescored"] = own

    rows = _ask_eval(calls, probe, concurrency, monitor)
    right = sum(1 for row in rows if row["right"])
    result["eval"] = {"count": len(rows), "correct": right, "score": round(right / len(rows), 4), "items": rows}
    result["duration_s"] = round(time.monotonic() - started, 3)
    if say:
        say(f"correctness: eval {right}/{len(rows)}, {result['duration_s']:.1f} s in all")
    return result
