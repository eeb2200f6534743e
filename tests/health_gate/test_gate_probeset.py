"""The correctness probe's data (llm_gate.probeset): the probe sets the role ships, their checks, the seeded eval."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate
from gate_fakes import REPO, ROLE
from role_files import import_file

PROBES = sorted((ROLE / "files" / "probes").glob("*.json"))


def test_splitmix64_gives_the_published_sequence():
    """Seed 0's first outputs (Vigna's reference implementation, splitmix64.c): portable across Pythons."""
    rng = llm_gate.SplitMix64(0)
    assert [rng.next() for _ in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_every_shipped_probe_set_loads_and_its_answers_are_right(path):
    probe = llm_gate.load_probe_set(str(path))
    assert probe["name"] == path.stem and len(probe["digest"]) == 64
    ids = [p["id"] for p in probe["golden_prompts"]]
    assert len(ids) == len(set(ids)) and set(probe["consistency"]["items"]) <= set(ids)
    for item in probe["eval_items"]:
        question = item["messages"][-1]["content"]
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        if item["id"].startswith("steps-"):
            expected = _steps_answer(question, numbers)
        elif "after" in question:
            expected = numbers[0] + 1
        elif " times " in question:
            expected = numbers[0] * numbers[1]
        elif " - " in question or "away" in question:
            expected = numbers[0] - numbers[1]
        else:
            expected = numbers[0] + numbers[1]
        assert item["answer"] == str(expected), question


def _steps_answer(question: str, numbers: list[int]) -> int:
    """A two- or three-step problem's answer, worked out from its words (not from the generator's arithmetic)."""
    if "packs" in question:
        packs, each, given = numbers
        return packs * each - given
    if "twice as many" in question:
        first, more = numbers
        return first + (first + more) + 2 * (first + more)
    if "box holds" in question:
        per_box, boxes, friends = numbers
        assert per_box * boxes % friends == 0, question
        return per_box * boxes // friends
    if "sold" in question:
        had, sold, _price, bought = numbers
        return had - sold + bought
    rate_a, days_a, rate_b, days_b = numbers
    return rate_a * days_a + rate_b * days_b


def test_the_steps_family_is_whole_positive_and_varied():
    spec = {"seed": 7, "max_tokens": 8, "families": [{"family": "steps", "count": 200}]}
    questions = [(item["messages"][0]["content"], int(item["answer"])) for item in llm_gate.eval_items(spec)]
    assert all(answer > 0 for _, answer in questions)
    for words in ("packs", "twice as many", "box holds", "sold", "reads"):
        assert sum(words in question for question, _ in questions) >= 20, words
    assert all(_steps_answer(q, [int(n) for n in re.findall(r"\d+", q)]) == a for q, a in questions)


def test_the_eval_is_the_same_for_a_seed_and_another_for_another_seed():
    spec = json.loads((ROLE / "files/probes/chat-general.json").read_text())["eval"]
    first, again = llm_gate.eval_items(spec), llm_gate.eval_items(json.loads(json.dumps(spec)))
    assert first == again
    other = llm_gate.eval_items(dict(spec, seed=spec["seed"] + 1))
    assert [i["answer"] for i in other] != [i["answer"] for i in first]
    assert len(first) == sum(f["count"] for f in spec["families"])


def test_a_conversation_turn_is_built_on_the_earlier_outputs():
    golden = {"max_tokens": 4, "items": [{"id": "talk", "turns": ["A:", " B:", " C:"]}]}
    items = llm_gate.golden_prompts(golden)
    assert [i["id"] for i in items] == ["talk/1", "talk/2", "talk/3"]
    from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.probe import prompt_of

    priors = [[], ["one"], ["one", "two"]]
    assert [prompt_of(items[n], priors[n]) for n in range(3)] == ["A:", "A:one B:", "A:one B:two C:"]


def test_a_turn_is_asked_on_what_its_reference_was_asked_on():
    from ansible_collections.llm_deploy.inference.plugins.module_utils.llm_gate.probe import prior_of

    turn3 = llm_gate.golden_prompts({"max_tokens": 4, "items": [{"id": "talk", "turns": ["A:", " B:", " C:"]}]})[2]
    own = {"talk/1": "mine1", "talk/2": "mine2"}
    assert prior_of(turn3, {}, own) == ["mine1", "mine2"]
    reference = {"talk/1": {"text": "ref1"}, "talk/2": {"text": "ref2"}}
    assert prior_of(turn3, reference, own) == ["ref1", "ref2"]
    reference["talk/3"] = {"text": "ref3", "prior": ["asked1", "asked2"]}
    assert prior_of(turn3, reference, own) == ["asked1", "asked2"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"golden": {"max_tokens": 4, "items": []}}, "golden.items must be a non-empty list"),
        ({"golden": {"max_tokens": 4, "items": [{"id": "x", "prompt": "a", "turns": ["b", "c"]}]}}, "exactly one of"),
        ({"golden": {"max_tokens": 4, "items": [{"id": "x", "prefix": "p", "suffixes": ["a"]}]}}, "at least two"),
        ({"consistency": {"items": ["nope"]}}, "names 'nope', which is no golden item"),
        ({"eval": {"seed": 1, "max_tokens": 4, "families": [{"family": "div", "count": 1, "prompt": "x"}]}}, "must be"),
        ({"eval": {"seed": 1, "max_tokens": 4, "families": [{"family": "add", "count": 1, "prompt": "{c}"}]}}, "fit"),
        ({"name": "has space"}, "name must be a plain name"),
    ],
)
def test_a_wrong_probe_set_is_refused_naming_what_is_wrong(change, words):
    data = json.loads((ROLE / "files/probes/tiny-rehearsal.json").read_text())
    data.update(change)
    with pytest.raises(llm_gate.GateUsageError, match=re.escape(words)):
        llm_gate.load_probe_set(data)


@pytest.mark.parametrize(
    ("reply", "answer"),
    [("42", "42"), (" 1,114.", "1114"), ("<think>7 or 8?</think>The answer is 8", "8"), ("-3", "-3"), ("no", None)],
)
def test_the_answer_is_the_first_integer_of_the_reply(reply, answer):
    assert llm_gate.extract_answer(reply) == answer


def test_the_preflight_filter_names_a_missing_or_wrong_probe_set():
    problems = import_file(REPO / "filter_plugins" / "health_gate.py").health_gate_probe_set_problems
    assert problems((ROLE / "files/probes/chat-general.json").read_text()) == []
    assert problems("") == ["no such probe set was found"]
    assert "it is no JSON" in problems("{not json")[0]
    assert "golden.items" in problems(json.dumps({"name": "x", "version": 1, "golden": {}, "eval": {}}))[0]


def test_the_docs_table_of_what_the_eval_comparison_refuses_is_computed():
    """docs/health-gate.md's table per profile is tools/probe-set power-table's output, to the character."""
    table = subprocess.run(
        [sys.executable, str(REPO / "tools" / "probe-set"), "power-table"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert table.count("\n") == 7 and "| sglang_servers: " in table
    assert table in (REPO / "docs" / "health-gate.md").read_text()
