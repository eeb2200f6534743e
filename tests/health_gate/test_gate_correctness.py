"""The correctness half of the verdict, through the whole gate (llm_gate.run_gate) against SGLang's API.

The server is tests/shared/fake_sglang_lm.py: SGLang 0.5.11's ``/tokenize``, ``/generate`` (token ids,
log-probabilities, teacher forcing), ``/flush_cache`` and chat over a toy model whose faults are
chosen per test (real SGLang cannot run on this CPU; the rehearsal tests run the real CPU engine).
Each test records a first gate as the last-known-good would (its verdict's baseline), changes the
server, and gates again with that baseline and another unit, as a deploy does.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.llm_deploy.inference.plugins.module_utils import llm_gate
from fake_sglang_lm import FakeSGLangLM
from gate_fakes import ROLE, base_options

PROBE = json.loads((ROLE / "files/probes/chat-general.json").read_text())


@pytest.fixture
def toy():
    server = FakeSGLangLM(api_key="k-api", admin_api_key="k-admin").start()
    yield server
    server.close()


def gate(server: FakeSGLangLM, unit: str, baseline: dict | None = None, **extra):
    """One whole gate of ``server`` as a deploy of ``unit`` runs it, with the probe."""
    options = base_options(
        server.url,
        engine="sglang",
        api_key="k-api",
        probe_set=PROBE,
        min_eval_score=0.9,
        metadata={"unit_sha256": unit, "model_revision": extra.pop("revision", "r1")},
        baseline=baseline,
    )
    options.update({"admin_api_key": "k-admin", **extra})
    return llm_gate.run_gate(options)


def recorded(report: dict) -> dict:
    """What the last-known-good keeps of a passed gate (record_good: the verdict's baseline)."""
    assert report["passed"], report["reasons"]
    return report["verdict"]["baseline"]


def checks(report: dict) -> dict:
    return {check["name"]: check for check in report["checks"]}


def test_an_unchanged_server_passes_and_its_outputs_become_the_reference(toy):
    first = gate(toy, "u1")
    baseline = recorded(first)
    record = baseline["correctness"]
    assert record["probe"]["digest"] == llm_gate.digest_of(PROBE) and record["model_revision"] == "r1"
    count = len(llm_gate.load_probe_set(PROBE)["eval_items"])
    totals = {k: v for k, v in record["eval"].items() if k != "answers"}
    assert totals == {"score": 1.0, "correct": count, "count": count}
    assert len(record["eval"]["answers"]) == count and all(record["eval"]["answers"].values())
    assert set(record["golden"]) == {"code", "prose", "doc/1", "doc/2", "doc/3", "talk/1", "talk/2"}
    for golden in record["golden"].values():
        assert len(golden["token_ids"]) == 32 == len(golden["logprobs"]) == len(golden["rescored_logprobs"])
    assert record["schema"] == llm_gate.RECORD_SCHEMA
    assert f"right: consistency 3/3, eval {count}/{count} (min 0.9)" in first["summary"]

    again = gate(toy, "u2", baseline)
    found = checks(again)
    assert again["passed"], again["reasons"]
    assert found["golden_outputs"]["value"] == 1.0 and found["golden_outputs"]["same"] == 7
    assert all(row["drift"] == 0.0 == row["kl"] for row in found["golden_outputs"]["prompts"])
    assert found["eval_score_vs_last_known_good"]["ok"] and found["eval_score_vs_last_known_good"]["paired"]
    assert "golden 7/7" in again["summary"]


def test_the_probe_flushes_with_the_admin_key_and_the_hits_are_hits(toy):
    report = gate(toy, "u1")
    flushes = [body for path, body in toy.calls if path == "/flush_cache"]
    assert len(flushes) == 1, "once, before the golden pass: the consistency prompts' misses need no flush"
    assert not [note for note in report["notes"] if "flush_cache" in note]
    rows = checks(report)["consistency"]["prompts"]
    assert all(row["cached_tokens"] > 0 for row in rows)
    asked = report["correctness"]["consistency"]
    assert all(item["miss"]["cached_tokens"] == 0 for item in asked), "a miss served cached tokens"
    # Without the admin key the flush is refused: only the golden pass may start with hits, the
    # consistency check still compares a miss with a hit (a note, no failure).
    without = gate(toy, "u1", admin_api_key=None)
    assert without["passed"], without["reasons"]
    assert "/flush_cache answered HTTP 401" in " ".join(without["notes"]) and checks(without)["cache_hit_checked"]["ok"]
    golden = report["correctness"]["golden"]
    assert golden["code"]["cached_tokens"] == 0 and golden["doc/2"]["cached_tokens"] > 0
    assert golden["talk/2"]["cached_tokens"] > len(PROBE["golden"]["items"][3]["turns"][0])


def test_a_kernel_change_that_flips_near_ties_passes_a_broken_server_fails(toy):
    baseline = recorded(gate(toy, "u1"))
    toy.mode = "near_tie"
    flipped = gate(toy, "u2", baseline)
    golden = checks(flipped)["golden_outputs"]
    assert golden["same"] < 7, "the near-tie server flipped no token: the test proves nothing"
    assert flipped["passed"], flipped["reasons"]
    assert all(row["ok"] and (row["same"] or row["near_tie"]) for row in golden["prompts"])
    assert all(row["drift"] <= 0.05 for row in golden["prompts"])

    toy.mode = "broken"
    broken = gate(toy, "u3", baseline)
    assert not broken["passed"]
    golden = checks(broken)["golden_outputs"]
    assert golden["value"] == 0.0 and all(row["drift"] > 1 for row in golden["prompts"])
    assert any(
        reason.startswith("golden outputs differ from the last-known-good's on 7 of 7 prompts (code from token")
        and reason.endswith("health_gate_accept_output_change=true (the new outputs then become the golden ones)")
        for reason in broken["reasons"]
    ), broken["reasons"]


def test_a_cache_hit_that_changes_the_output_fails(toy):
    toy.mode = "cache_bug"
    report = gate(toy, "u1")
    assert not report["passed"]
    rows = checks(report)["consistency"]["prompts"]
    assert all(row["hit_differs_at"] is not None for row in rows)
    assert any(not row["near_tie"] for row in rows), "a hit that differs beyond a near-tie is what fails"
    assert any(reason.startswith("a cache hit changed the output (") for reason in report["reasons"])


def test_greedy_output_that_is_not_deterministic_fails(toy):
    toy.mode = "nondeterministic"
    report = gate(toy, "u1")
    assert not report["passed"]
    assert any(reason.startswith("greedy decoding is not deterministic") for reason in report["reasons"])


def test_wrong_answers_fail_the_floor_and_the_last_known_good(toy):
    baseline = recorded(gate(toy, "u1"))
    toy.mode = "wrong_answers"
    report = gate(toy, "u2", baseline, revision="r2")
    found = checks(report)
    assert "golden_outputs" not in found, "another model revision is judged by its score, not by the golden outputs"
    count = found["eval_score"]["count"]
    assert found["eval_score"]["value"] == 0.0 and not found["eval_score_vs_last_known_good"]["ok"]
    assert f"eval score 0.00 (0 of {count}) is below min_eval_score 0.9" in report["reasons"]
    assert any("golden outputs not compared: the model revision changed (r1 -> r2)" in n for n in report["notes"])


def test_accepting_a_change_of_outputs_passes_and_makes_them_the_reference(toy):
    baseline = recorded(gate(toy, "u1"))
    toy.mode = "broken"
    report = gate(toy, "u2", baseline, accept_output_change=True)
    assert report["passed"], report["reasons"]
    assert checks(report)["golden_outputs"]["accepted"]
    new = report["verdict"]["baseline"]["correctness"]
    assert new["golden"] != baseline["correctness"]["golden"]
    not_accepted = gate(toy, "u3", baseline)
    assert not not_accepted["passed"]
    assert not_accepted["verdict"]["baseline"] is None


def test_accepting_a_change_and_accepting_back_gives_the_first_reference_again(toy):
    """A conversation's later turn is asked on the turns its reference was asked on: accepting a
    broken engine's outputs and then the good engine's again restores every golden output."""
    first = recorded(gate(toy, "u1"))
    toy.mode = "broken"
    broken = recorded(gate(toy, "u2", first, accept_output_change=True))
    toy.mode = "ok"
    back = recorded(gate(toy, "u3", broken, accept_output_change=True))
    assert back["correctness"]["golden"] == first["correctness"]["golden"]
    again = gate(toy, "u4", back)
    assert again["passed"] and checks(again)["golden_outputs"]["same"] == 7


def test_a_no_op_gate_asks_nothing_and_keeps_the_record(toy):
    baseline = recorded(gate(toy, "u1"))
    before = len(toy.calls)
    report = gate(toy, "u1", baseline)
    assert report["passed"] and report["correctness"] is None
    assert report["correctness_why"].startswith("the unit is the last-known-good one")
    assert not [c for c in toy.calls[before:] if c[0] in ("/generate", "/flush_cache", "/tokenize")]
    assert report["verdict"]["baseline"]["correctness"] == baseline["correctness"]
    always = gate(toy, "u1", baseline, correctness="always")
    assert always["correctness"] is not None and checks(always)["golden_outputs"]["same"] == 7


def test_the_same_engine_keeps_the_first_reference_a_new_model_revision_replaces_it(toy):
    baseline = recorded(gate(toy, "u1"))
    toy.mode = "near_tie"
    kept = recorded(gate(toy, "u2", baseline))
    assert kept["correctness"]["golden"] == baseline["correctness"]["golden"]
    new_revision = recorded(gate(toy, "u3", kept, revision="r2"))
    assert new_revision["correctness"]["model_revision"] == "r2"
    assert new_revision["correctness"]["golden"] != baseline["correctness"]["golden"]


def test_a_probe_the_server_cannot_answer_fails_the_gate_beside_the_speed_checks(toy):
    toy.mode = "no_tokenize"
    report = gate(toy, "u1", min_decode_tps=1)
    assert not report["passed"] and "decode_tps" in checks(report)
    assert report["reasons"] == [
        "the correctness probe could not ask the server: golden code: HTTP 404 from POST /tokenize: "
        '{"detail": "Not Found"}'
    ]
    assert report["verdict"]["baseline"] is None and report["verdict"]["figures"]["correctness"] is None


def test_the_admin_key_never_reaches_the_report(toy):
    report = gate(toy, "u1")
    assert "k-admin" not in json.dumps(report) and "k-api" not in json.dumps(report)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("correctness", "sometimes", "correctness must be one of auto, always, off"),
        ("eval_confidence", 0.93, "eval_confidence must be one of 0.8, 0.9, 0.95, 0.975, 0.99"),
        ("min_eval_score", 1.5, "min_eval_score must be at most 1"),
        ("probe_set", {"name": "x"}, "the probe set: version must be an integer"),
    ],
)
def test_bad_correctness_options_are_refused_before_the_server_is_asked(option, value, words):
    with pytest.raises(llm_gate.GateUsageError, match=words):
        llm_gate.GateConfig.from_options({"url": "http://127.0.0.1:9", option: value})
