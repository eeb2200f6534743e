# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The correctness probe's data: a probe set (what to ask, versioned, in the profile) and its seeded eval.

A probe set is a JSON document (the role ships them in ``files/probes/``)::

    {"name": "tiny-rehearsal", "version": 1, "description": "...",
     "golden": {"max_tokens": 16,
                "items": [{"id": "code", "prompt": "def fib(n):"},
                          {"id": "doc", "prefix": "<a long shared text>", "suffixes": ["Q: ...", "Q: ..."]},
                          {"id": "talk", "turns": ["User: ...\\nAssistant:", "\\nUser: ...\\nAssistant:"]}]},
     "consistency": {"items": ["code", "doc/2"]},
     "eval": {"seed": 20261204, "max_tokens": 6, "request": {"sglang": {...}},
              "families": [{"family": "add", "digits": 1, "count": 12, "prompt": "{a} + {b} ="}]}}

**Golden** items are raw text completions (no chat template: what is compared is the engine's
arithmetic on the same tokens, and a shared prefix stays a shared prefix): a ``prompt``; a
``prefix`` with ``suffixes`` (ids ``<id>/1``, ``<id>/2``, ...: each later one finds the prefix
in a prefix cache); or ``turns`` of a conversation (ids ``<id>/1``, ...), where turn k's prompt is
every earlier turn followed by the output it got, so each turn extends the cached one before it.
**Consistency** names golden items asked again with the cache warm (a hit) and once more (a
repeat). The **eval** is generated from the seed (:func:`eval_items`): arithmetic and short word
problems with exact answers, asked as chat messages, no download; ``request`` maps an engine's
name to extra fields of its chat requests (``transformers serve`` refuses fields it does not know).

Items are generated with SplitMix64 (:class:`SplitMix64`), not :mod:`random`, so that a seed
gives the same eval on every Python version and host.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .errors import GateUsageError, read_json_option

PROBE_SCHEMA = 1
_MASK64 = (1 << 64) - 1
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class SplitMix64:
    """A small, portable pseudo-random generator (Steele, Lea and Flood's SplitMix64)."""

    def __init__(self, seed: int) -> None:
        """Start from ``seed`` (any integer; reduced to 64 bits)."""
        self.state = int(seed) & _MASK64

    def next(self) -> int:
        """The next 64-bit value."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def below(self, bound: int) -> int:
        """An integer in ``[0, bound)`` (bound <= 2**32; the modulo bias is below 2**-32)."""
        return self.next() % bound

    def between(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return low + self.below(high - low + 1)

    def choice(self, options: list[Any]) -> Any:
        """One of ``options``."""
        return options[self.below(len(options))]


# The word problems' names and things; a family may bring its own.
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Ema", "Finn", "Gita", "Hugo", "Ines", "Jon", "Kai", "Lena"]
THINGS = ["apples", "books", "coins", "pens", "stamps", "marbles", "cards", "shells"]


def _digits_range(digits: int) -> tuple[int, int]:
    """The numbers of exactly ``digits`` digits (1 digit: 0 to 9)."""
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def _family_item(family: dict[str, Any], rng: SplitMix64) -> tuple[dict[str, Any], int]:
    """One item of ``family``: (the fields its prompt template is filled with, the answer)."""
    kind = family["family"]
    digits = int(family.get("digits", 1))
    low, high = _digits_range(digits)
    if kind in ("add", "sub", "mul"):
        other = int(family.get("digits_b", digits))
        b_low, b_high = _digits_range(other)
        a, b = rng.between(low, high), rng.between(b_low, b_high)
        if kind == "sub" and b > a:
            a, b = b, a
        answer = a + b if kind == "add" else (a - b if kind == "sub" else a * b)
        return {"a": a, "b": b}, answer
    if kind == "next":
        n = rng.between(low, high - 1)
        return {"n": n}, n + 1
    if kind == "word":
        name = rng.choice(family.get("names") or NAMES)
        things = rng.choice(family.get("things") or THINGS)
        a, b = rng.between(max(low, 2), high), rng.between(max(low, 1), high)
        gives = rng.below(2) == 1 and b < a
        answer = a - b if gives else a + b
        template = family.get("give_prompt" if gives else "prompt")
        return {"name": name, "things": things, "a": a, "b": b, "template": template}, answer
    if kind == "steps":
        return _steps_item(family, rng)
    raise GateUsageError(f"eval family {kind!r} is unknown (known: {', '.join(FAMILIES)})")


FAMILIES = ("add", "sub", "mul", "next", "word", "steps")


def _steps_item(family: dict[str, Any], rng: SplitMix64) -> tuple[dict[str, Any], int]:
    """A word problem of two or three steps with an exact whole answer (GSM8K-like, generated): one of
    :data:`STEP_PROBLEMS`, drawn by ``rng``, its numbers drawn so that every step stays whole and positive."""
    names = list(family.get("names") or NAMES)
    first = rng.choice(names)
    second = rng.choice([n for n in names if n != first])
    things = rng.choice(family.get("things") or THINGS)
    shape = rng.below(len(STEP_PROBLEMS))
    a, b, c, d = rng.between(3, 19), rng.between(2, 9), rng.between(2, 9), rng.between(2, 19)
    if shape == 0:  # packs bought, some given away
        c = rng.between(1, a * b - 1)
        answer = a * b - c
    elif shape == 1:  # more than, then twice as many, all together
        answer = a + (a + b) + 2 * (a + b)
    elif shape == 2:  # boxes filled, shared equally
        a = c * rng.between(2, 9)
        answer = a * b // c
    elif shape == 3:  # sold some, bought more (the price is a distractor)
        b = rng.between(1, a - 1)
        answer = a - b + d
    else:  # two rates over two spans
        answer = a * b + c * d
    fields = {"name": first, "other": second, "things": things, "a": a, "b": b, "c": c, "d": d}
    return {**fields, "template": STEP_PROBLEMS[shape]}, answer


# The templates of the "steps" family, in the order _steps_item draws them (a family may not bring its own:
# each template's arithmetic is in _steps_item).
STEP_PROBLEMS = [
    "{name} buys {a} packs of {things} with {b} {things} in each pack, then gives {c} {things} to {other}. "
    "How many {things} does {name} have left?",
    "{name} has {a} {things}. {other} has {b} more {things} than {name}, and Max has twice as many {things} as "
    "{other}. How many {things} do the three of them have together?",
    "A box holds {a} {things}. {name} fills {b} boxes and then shares all of the {things} equally among {c} "
    "friends. How many {things} does each friend get?",
    "{name} had {a} {things}, sold {b} of them to {other} for {c} dollars each, and then bought {d} more. "
    "How many {things} does {name} have now?",
    "{name} reads {a} pages a day for {b} days, then {c} pages a day for {d} days. How many pages does "
    "{name} read in all?",
]


def eval_items(spec: dict[str, Any], seed_offset: int = 0) -> list[dict[str, Any]]:
    """The eval of a probe set's ``eval`` section: ``[{"id", "messages", "answer"}, ...]``.

    Each family draws ``count`` items from one SplitMix64 stream seeded with ``seed`` (plus
    ``seed_offset``, for training data that must not be the eval itself), in the order given.
    A family's ``prompt`` is a :meth:`str.format` template of its fields (``{a}``, ``{b}``, ``{n}``,
    ``{name}``, ``{things}``); ``system`` adds a system message to every item.
    """
    rng = SplitMix64(int(spec["seed"]) + seed_offset)
    items: list[dict[str, Any]] = []
    for family in spec["families"]:
        for index in range(int(family["count"])):
            fields, answer = _family_item(family, rng)
            template = fields.pop("template", None) or family["prompt"]
            messages = [{"role": "user", "content": template.format(**fields)}]
            if spec.get("system"):
                messages.insert(0, {"role": "system", "content": spec["system"]})
            items.append({"id": f"{family['family']}-{index + 1}", "messages": messages, "answer": str(answer)})
    return items


_NUMBER_RE = re.compile(r"-?\d[\d,]*")
_THINK_RE = re.compile(r"<think>.*?(</think>|\Z)", re.S)


def extract_answer(text: str) -> str | None:
    """The answer in a reply: its first integer (commas dropped; a ``<think>`` section skipped), or None."""
    match = _NUMBER_RE.search(_THINK_RE.sub("", text or ""))
    return match.group(0).replace(",", "") if match else None


def golden_prompts(golden: dict[str, Any]) -> list[dict[str, Any]]:
    """The golden items in the order they are asked: ``[{"id", "prompt"}]`` or, for a turn of a
    conversation, ``{"id", "turns", "turn"}`` (its prompt needs the outputs of the turns before it)."""
    out: list[dict[str, Any]] = []
    for item in golden["items"]:
        if "prompt" in item:
            out.append({"id": item["id"], "prompt": item["prompt"]})
        elif "prefix" in item:
            for n, suffix in enumerate(item["suffixes"], 1):
                out.append({"id": f"{item['id']}/{n}", "prompt": item["prefix"] + suffix})
        else:
            for n in range(1, len(item["turns"]) + 1):
                out.append({"id": f"{item['id']}/{n}", "turns": item["turns"], "turn": n})
    return out


def _problems(data: Any) -> list[str]:
    """What is wrong with a probe set document (empty when it is right)."""
    if not isinstance(data, dict):
        return ["a probe set must be a mapping"]
    problems = []
    if not isinstance(data.get("name"), str) or not _ID_RE.match(data.get("name") or ""):
        problems.append("name must be a plain name (letters, digits, '_', '.', '-')")
    if not isinstance(data.get("version"), int) or isinstance(data.get("version"), bool):
        problems.append("version must be an integer")
    golden = data.get("golden")
    ids: list[str] = []
    if not isinstance(golden, dict) or not isinstance(golden.get("items"), list) or not golden["items"]:
        problems.append("golden.items must be a non-empty list")
    else:
        if not isinstance(golden.get("max_tokens"), int) or golden["max_tokens"] < 1:
            problems.append("golden.max_tokens must be a whole number of at least 1")
        for n, item in enumerate(golden["items"]):
            shapes = [key for key in ("prompt", "prefix", "turns") if key in item] if isinstance(item, dict) else []
            if len(shapes) != 1 or not _ID_RE.match(str(item.get("id", ""))):
                problems.append(
                    f"golden.items[{n}] needs an id and exactly one of prompt, prefix (with suffixes), turns"
                )
                continue
            texts = [item["prompt"]] if "prompt" in item else None
            if "prefix" in item:
                texts = [item["prefix"], *item.get("suffixes", [])] if isinstance(item.get("suffixes"), list) else []
                if len(texts) < 3:
                    problems.append(f"golden.items[{n}] ({item['id']}): suffixes must list at least two texts")
            if "turns" in item:
                texts = item["turns"] if isinstance(item["turns"], list) and len(item["turns"]) >= 2 else []
                if not texts:
                    problems.append(f"golden.items[{n}] ({item['id']}): turns must list at least two texts")
            if not all(isinstance(t, str) and t for t in texts or []):
                problems.append(f"golden.items[{n}] ({item['id']}): every text must be a non-empty string")
        ids = [p["id"] for p in golden_prompts(golden)] if not problems else []
    for name in (data.get("consistency") or {}).get("items") or []:
        if ids and name not in ids:
            problems.append(f"consistency.items names {name!r}, which is no golden item ({', '.join(ids)})")
    spec = data.get("eval")
    if not isinstance(spec, dict) or not isinstance(spec.get("families"), list) or not spec["families"]:
        problems.append("eval.families must be a non-empty list")
    else:
        if not isinstance(spec.get("seed"), int) or not isinstance(spec.get("max_tokens"), int):
            problems.append("eval.seed and eval.max_tokens must be integers")
        request = spec.get("request", {})
        if not isinstance(request, dict) or not all(isinstance(v, dict) for v in request.values()):
            problems.append("eval.request must map engine names to the extra fields of their chat requests")
        for n, family in enumerate(spec["families"]):
            if not isinstance(family, dict) or family.get("family") not in FAMILIES:
                problems.append(f"eval.families[{n}].family must be one of {', '.join(FAMILIES)}")
            elif not isinstance(family.get("count"), int) or family["count"] < 1:
                problems.append(f"eval.families[{n}] needs a count of at least 1")
            elif not family.get("prompt") and family["family"] != "steps":
                problems.append(f"eval.families[{n}] needs a prompt template (only steps brings its own)")
    return problems


def digest_of(data: dict[str, Any]) -> str:
    """The sha256 of a probe set's canonical JSON: two gates asked the same things when it is equal."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def load_probe_set(value: Any) -> dict[str, Any] | None:
    """A checked probe set: the document plus ``digest``, ``golden_prompts`` and ``eval_items``; None
    for no probe set (None, '' or {}). ``value`` is the document or a path to it. Raises
    :class:`GateUsageError` naming every problem.
    """
    if value in (None, "", {}):
        return None
    value, source = read_json_option(value, "the probe set")
    problems = _problems(value)
    if problems:
        raise GateUsageError(f"{source}: " + "; ".join(problems))
    try:
        items = eval_items(value["eval"])
    except (KeyError, IndexError, ValueError) as exc:
        raise GateUsageError(f"{source}: an eval family's prompt template does not fit its fields: {exc}") from exc
    return {
        **value,
        "digest": digest_of(value),
        "golden_prompts": golden_prompts(value["golden"]),
        "eval_items": items,
    }


def probe_identity(probe: dict[str, Any]) -> dict[str, Any]:
    """What a record says of the probe set it was made with."""
    return {"name": probe["name"], "version": probe["version"], "digest": probe["digest"]}
