# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Whether the server says the right things: the correctness half of the verdict (:mod:`.verdict` calls it).

Three checks over what :func:`.probe.run_probe` brought back, and a fourth against the record:

* ``golden_outputs``: the golden prompts' outputs against the last-known-good's, when it was
  recorded with the same probe set on the same model revision. A prompt passes when its tokens
  (text, where the engine gives no ids) are the same, or, where the engine re-scores (teacher
  forcing), when they part at a near-tie (this server ranks the reference's token within
  ``tie_margin`` of its own choice) and the reference's tokens re-scored here differ from the
  reference's own re-score of them (kept in the record) by at most ``max_rescore_kl``: SGLang's
  KL estimate, mean(e^r - 1 - r) over the tokens, r the difference of the two log-probabilities.
  Both are prefill log-probabilities, like with like. At least ``golden_min_match_share`` of the
  prompts must pass.
* ``consistency``: each consistency prompt asked as a cache miss (the golden pass, after a flush),
  a hit, and a repeat. The hit must give the miss's tokens, and the repeat the hit's, or part from
  them at a near-tie: the earlier one's margin there within ``tie_margin``, the later one's token
  its runner-up, the log-probabilities before it within ``max_logprob_drift`` (a server's greedy
  output may flip a near-tie with the batch it is in, which live traffic changes). Where the engine
  has a prefix cache, a flush that failed or a hit that served no cached tokens fails the check
  unless ``require_cache_hit`` is off.
* ``eval_score``: the share of the generated questions answered exactly, at least ``min_eval_score``.
* ``eval_score_vs_last_known_good``: against the last-known-good's answers to the same questions
  (same probe set, any model revision): refused only when this server is confidently worse by more
  than ``eval_margin_pct`` points (:mod:`.eval_compare`: McNemar's exact test on the questions the
  two answered differently). An unchanged server never fails it.

Every log-probability of every golden output equal to 0 fails (an engine that fills the field
without computing it), and so does an SGLang-speaking server that answers without token ids
(:mod:`.probe` refuses the answer). ``accept_output_change`` lets the golden outputs and the
relative score differ on purpose (the new outputs become the reference); the floor and the
consistency check still apply.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .eval_compare import counts_from_totals, paired_counts, refuses, sign_test_p

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .config import GateConfig

ACCEPT_VARIABLE = "health_gate_accept_output_change"
CACHE_VARIABLE = "health_gate_require_cache_hit"
# The confidences the eval's comparison accepts (one-sided).
CONFIDENCES = (0.8, 0.9, 0.95, 0.975, 0.99)
# What a record holds: 2 added the eval's answers question by question and each golden output's
# re-score by the server that recorded it. A record of an older schema is replaced at the next pass.
RECORD_SCHEMA = 2


def record_of(result: dict[str, Any], model_revision: str | None) -> dict[str, Any]:
    """What the last-known-good keeps of a probe: the probe set, the model revision, the eval's
    score and each golden output (text, and token ids and their log-probabilities where given; a
    conversation's later turn also the texts of the turns before it that it was asked on)."""
    golden = {}
    own = result.get("self_rescored") or {}
    for key, value in (result.get("golden") or {}).items():
        golden[key] = {
            name: value[name] for name in ("text", "token_ids", "logprobs", "prior") if value.get(name) is not None
        }
        if (own.get(key) or {}).get("logprobs") is not None:
            golden[key]["rescored_logprobs"] = own[key]["logprobs"]
    ev = result.get("eval") or {}
    answers = {row["id"]: bool(row.get("right")) for row in ev.get("items") or []}
    return {
        "schema": RECORD_SCHEMA,
        "probe": result.get("probe"),
        "model_revision": model_revision,
        "eval": {"score": ev.get("score"), "correct": ev.get("correct"), "count": ev.get("count"), "answers": answers},
        "golden": golden,
    }


def reference_of(cfg: GateConfig) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None]:
    """(the reference for the eval score, the reference for the golden outputs, a note) from the
    baseline's ``correctness`` record: the score when it used this probe set, the outputs when
    also on this model revision."""
    record = (cfg.baseline or {}).get("correctness") or None
    if not record or not cfg.probe_set:
        return None, None, None
    if (record.get("probe") or {}).get("digest") != cfg.probe_set["digest"]:
        return None, None, "not compared with the last-known-good's outputs: it used another probe set"
    revision = (cfg.metadata or {}).get("model_revision")
    if record.get("model_revision") != revision:
        note = (
            f"golden outputs not compared: the model revision changed ({record.get('model_revision')} -> "
            f"{revision}); its outputs become the golden ones once it is kept"
        )
        return record, None, note
    return record, record, None


def wanted(cfg: GateConfig) -> tuple[bool, str]:
    """Whether this gate runs the probe, and why (``correctness``: off, always, or auto).

    auto: not when the unit is the last-known-good's and its record holds this probe set's outputs
    (a no-op deploy asks nothing more than the speed gate); otherwise yes.
    """
    if cfg.correctness == "off" or not cfg.probe_set:
        return False, "the correctness probe is off" if cfg.correctness == "off" else "no probe set"
    if cfg.correctness == "always":
        return True, "asked for (correctness: always)"
    baseline = cfg.baseline or {}
    record = baseline.get("correctness") or {}
    unit = (cfg.metadata or {}).get("unit_sha256")
    same_unit = bool(unit) and baseline.get("unit_sha256") == unit
    if same_unit and (record.get("probe") or {}).get("digest") == cfg.probe_set["digest"]:
        return False, "the unit is the last-known-good one, whose outputs were checked with this probe set"
    return True, "the unit changed" if baseline else "no last-known-good outputs yet"


def _first_difference(a: list[Any] | str, b: list[Any] | str) -> int | None:
    """The first index where ``a`` and ``b`` differ (the shorter one's length when one is a prefix), None when equal."""
    for index, (x, y) in enumerate(zip(a, b)):  # noqa: B905 - lengths differ on purpose
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _sequences(a: dict[str, Any], b: dict[str, Any]) -> tuple[Any, Any, str]:
    """What to compare of two outputs: token ids when both have them, else the text."""
    if a.get("token_ids") is not None and b.get("token_ids") is not None:
        return a["token_ids"], b["token_ids"], "token"
    return a.get("text") or "", b.get("text") or "", "character"


def _pairs(ours: list[Any], theirs: list[Any], upto: int | None = None) -> list[tuple[float, float]]:
    """The positions (up to index ``upto``) where both log-probability lists have a value."""
    return [(x, y) for x, y in zip(ours[:upto], theirs[:upto]) if x is not None and y is not None]  # noqa: B905


def _mean_drift(ours: list[Any], theirs: list[Any], upto: int | None = None) -> float | None:
    """The mean absolute difference of two log-probability lists (up to index ``upto``), None when unknown."""
    pairs = _pairs(ours, theirs, upto)
    return round(sum(abs(x - y) for x, y in pairs) / len(pairs), 4) if pairs else None


def kl_estimate(ours: list[Any], theirs: list[Any]) -> float | None:
    """SGLang's KL estimate between two scorings of the same tokens (``sglang/test/kl_test_utils.py``):
    mean(e^r - 1 - r), r = ours - theirs, >= 0 and 0 only when equal; None when nothing to compare.

    >>> kl_estimate([-1.0, -2.0], [-1.0, -2.0]), round(kl_estimate([-1.1], [-1.0]), 5)
    (0.0, 0.00484)
    """
    pairs = _pairs(ours, theirs)
    if not pairs:
        return None
    return round(sum(math.expm1(x - y) - (x - y) for x, y in pairs) / len(pairs), 6)


def compare_golden(
    reference: dict[str, Any], output: dict[str, Any], rescored: dict[str, Any] | None, cfg: GateConfig
) -> dict[str, Any]:
    """One golden prompt against the reference's output: same, a near-tie (re-scored), or different."""
    ref_seq, our_seq, unit = _sequences(reference, output)
    first = _first_difference(ref_seq, our_seq)
    row: dict[str, Any] = {"same": first is None, "first_divergence": first, "unit": unit}
    if rescored and reference.get("rescored_logprobs"):
        kl = kl_estimate(rescored["logprobs"], reference["rescored_logprobs"])
        row.update(kl=kl, drift=_mean_drift(rescored["logprobs"], reference["rescored_logprobs"]))
        if first is not None and unit == "token" and first < len(rescored["logprobs"]):
            top, got = rescored["top"][first], rescored["logprobs"][first]
            row["margin_at_divergence"] = None if top is None or got is None else round(top - got, 4)
        within = kl is not None and kl <= cfg.max_rescore_kl
        margin = row.get("margin_at_divergence")
        row["near_tie"] = first is not None and within and margin is not None and margin <= cfg.tie_margin
        row["ok"] = within and (first is None or row["near_tie"])
    else:
        row["ok"] = first is None
    return row


def _parting(earlier: dict[str, Any], later: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    """Where ``later`` parts from ``earlier`` (None: it does not) and whether at a near-tie: the earlier
    one's margin there within ``tie_margin``, the later one's token the earlier one's runner-up, and
    the log-probabilities before it within ``max_logprob_drift``."""
    a, b, unit = _sequences(earlier, later)
    at = _first_difference(a, b)
    out: dict[str, Any] = {"at": at, "unit": unit, "near_tie": False}
    if at is None or unit != "token" or not earlier.get("margins") or not later.get("logprobs"):
        return out
    margins, runners = earlier["margins"], earlier.get("runners_up") or []
    margin = margins[at] if at < len(margins) else None
    runner_up = runners[at] if at < len(runners) else None
    token = later["token_ids"][at] if at < len(later["token_ids"]) else None
    drift = _mean_drift(later["logprobs"], earlier.get("logprobs") or [], at)
    # Two missing values (a shorter answer, a step without its top two) are no runner-up.
    is_runner_up = token is not None and runner_up == token
    out.update(margin=margin, drift=drift, runner_up=is_runner_up)
    out["near_tie"] = (
        margin is not None and margin <= cfg.tie_margin and is_runner_up and (drift or 0.0) <= cfg.max_logprob_drift
    )
    return out


def _consistency_row(item: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    """Miss, hit and repeat of one prompt: the hit must give the miss's tokens and the repeat the hit's,
    or part from them at a near-tie (:func:`_parting`)."""
    hit = _parting(item["miss"], item["hit"], cfg)
    again = _parting(item["hit"], item["repeat"], cfg)
    row: dict[str, Any] = {
        "id": item["id"],
        "unit": hit["unit"],
        "hit_differs_at": hit["at"],
        "repeat_differs_at": again["at"],
        "cached_tokens": item["hit"].get("cached_tokens"),
        "near_tie": hit["near_tie"],
        "repeat_near_tie": again["near_tie"],
    }
    if hit["at"] is not None:
        row.update(margin_at_divergence=hit.get("margin"), drift=hit.get("drift"), runner_up=hit.get("runner_up"))
    row["ok"] = (hit["at"] is None or hit["near_tie"]) and (again["at"] is None or again["near_tie"])
    return row


def _where(rows: list[dict[str, Any]], key: str) -> str:
    """``code from token 3, doc/2 from character 10`` for the rows that are not ok."""
    return ", ".join(f"{row['id']} from {row['unit']} {row[key]}" for row in rows)


def _golden_why(row: dict[str, Any], cfg: GateConfig) -> str:
    """Why one golden row is not ok: where it parted and what the re-score said (``doc/1 from token 0
    (margin 1.25 over tie_margin 0.2)``), or, for the same tokens, that their log-probabilities moved
    (``code: the same tokens, re-scored KL 0.014 over max_rescore_kl 0.0025``)."""
    kl, margin = row.get("kl"), row.get("margin_at_divergence")
    over_kl = kl is not None and kl > cfg.max_rescore_kl
    kl_words = f"re-scored KL {kl:g} over max_rescore_kl {cfg.max_rescore_kl:g}" if over_kl else ""
    if row["first_divergence"] is None:
        return f"{row['id']}: the same tokens, {kl_words}"
    words = [kl_words] if over_kl else []
    if margin is not None and margin > cfg.tie_margin:
        words.append(f"margin {margin:g} over tie_margin {cfg.tie_margin:g}")
    why = f" ({', '.join(words)})" if words else ""
    return f"{row['id']} from {row['unit']} {row['first_divergence']}{why}"


def judge_correctness(
    result: dict[str, Any] | None, cfg: GateConfig
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The correctness checks of a probe's ``result`` (None: it did not run); (checks, failure reasons, notes)."""
    if not result:
        return [], [], []
    if result.get("error"):
        check = {"name": "correctness_probe", "value": None, "op": "answered", "limit": None, "ok": False}
        return [check], [f"the correctness probe could not ask the server: {result['error']}"], []
    checks: list[dict[str, Any]] = []
    reasons: list[str] = []
    notes: list[str] = list(result.get("notes") or [])
    score_ref, golden_ref, note = reference_of(cfg)
    if note:
        notes.append(note)
    accepted = cfg.accept_output_change
    how_to_accept = (
        f"if the change of outputs is intended, deploy again with {ACCEPT_VARIABLE}=true "
        "(the new outputs then become the golden ones)"
    )

    if golden_ref and not all(value.get("rescored_logprobs") for value in (golden_ref.get("golden") or {}).values()):
        notes.append(
            "the last-known-good's record holds no re-score of its own golden tokens (an older version wrote it): "
            "its golden outputs must be the same token for token, and this gate's record replaces it"
        )
    zero = _all_zero_logprobs(result)
    if zero:
        checks.append({"name": "logprobs_computed", "value": zero, "op": "==", "limit": 0, "ok": False})
        reasons.append(
            f"every log-probability of the {zero} golden tokens is 0: the engine fills the field without computing "
            "it, so near-ties and re-scores cannot be judged"
        )

    if golden_ref:
        rows = []
        for key, ref in (golden_ref.get("golden") or {}).items():
            ours = (result.get("golden") or {}).get(key)
            if ours is not None:
                rows.append({"id": key, **compare_golden(ref, ours, (result.get("rescored") or {}).get(key), cfg)})
        passed = sum(1 for row in rows if row["ok"])
        share = round(passed / len(rows), 4) if rows else None
        ok = share is not None and share >= cfg.golden_min_match_share
        check = {"name": "golden_outputs", "value": share, "op": ">=", "limit": cfg.golden_min_match_share, "ok": ok,
                 "same": sum(1 for row in rows if row["same"]), "prompts": rows}  # fmt: skip
        if not ok and accepted:
            check.update(ok=True, accepted=True)
            parted = [row for row in rows if not row["same"]]
            notes.append(f"golden outputs differ on purpose ({ACCEPT_VARIABLE}): {_where(parted, 'first_divergence')}")
        elif not ok:
            bad = [row for row in rows if not row["ok"]]
            rescoring = (
                ""
                if result.get("rescored")
                else ", and the engine cannot re-score them to tell a near-tie from a broken server"
            )
            where = ", ".join(_golden_why(row, cfg) for row in bad)
            reasons.append(
                f"golden outputs differ from the last-known-good's on {len(bad)} of {len(rows)} prompts ({where}; "
                f"golden_min_match_share {cfg.golden_min_match_share:g}){rescoring}: {how_to_accept}"
            )
        checks.append(check)

    rows = [_consistency_row(item, cfg) for item in result.get("consistency") or []]
    if rows:
        ok = all(row["ok"] for row in rows)
        checks.append({"name": "consistency", "value": sum(1 for r in rows if r["ok"]), "op": "==",
                       "limit": len(rows), "ok": ok, "prompts": rows})  # fmt: skip
        flaky = [row for row in rows if row["repeat_differs_at"] is not None and not row["repeat_near_tie"]]
        moved = [row for row in rows if row["hit_differs_at"] is not None and not row["near_tie"]]
        if flaky:
            reasons.append(
                "greedy decoding is not deterministic: asked again in the same cache state, "
                f"{_where(flaky, 'repeat_differs_at')} gave other output, not at a near-tie "
                f"(tie_margin {cfg.tie_margin:g})"
            )
        if moved:
            reasons.append(
                f"a cache hit changed the output ({_where(moved, 'hit_differs_at')}), not at a near-tie "
                f"(tie_margin {cfg.tie_margin:g}, the miss's runner-up): the prefix cache serves other state than a "
                "miss computes"
            )
        _judge_cache(result, rows, cfg, checks, reasons, notes)

    ev = result.get("eval") or {}
    score, correct, count = ev.get("score"), ev.get("correct") or 0, ev.get("count") or 0
    if score is not None:
        ok = score >= cfg.min_eval_score
        checks.append({"name": "eval_score", "value": score, "op": ">=", "limit": cfg.min_eval_score, "ok": ok,
                       "correct": correct, "count": count})  # fmt: skip
        if not ok:
            reasons.append(
                f"eval score {score:.2f} ({correct} of {count}) is below min_eval_score {cfg.min_eval_score:g}"
            )
    ref_eval = (score_ref or {}).get("eval") or {}
    if score is not None and ref_eval.get("correct") is not None and cfg.eval_margin_pct > 0:
        check, reason = _eval_against_reference(ev, ref_eval, cfg)
        if reason and accepted:
            check.update(ok=True, accepted=True)
            notes.append(f"eval score below the last-known-good's on purpose ({ACCEPT_VARIABLE})")
        elif reason:
            reasons.append(f"{reason}: {how_to_accept}")
        checks.append(check)
    return checks, reasons, notes


def _all_zero_logprobs(result: dict[str, Any]) -> int:
    """The number of golden tokens when the engine gave log-probabilities and every one is 0, else 0."""
    values = [v for out in (result.get("golden") or {}).values() for v in out.get("logprobs") or []]
    return len(values) if values and all(v == 0 for v in values) else 0


def _judge_cache(
    result: dict[str, Any], rows: list[dict[str, Any]], cfg: GateConfig,
    checks: list[dict[str, Any]], reasons: list[str], notes: list[str],
) -> None:  # fmt: skip
    """Whether a cache hit was checked at all: on an engine with a prefix cache, the hits must have served
    cached tokens; else a failure, or a note when ``require_cache_hit`` is off. A flush that did not happen
    (a server its clients keep busy, or no admin key) is a note: the consistency prompts' misses are misses
    by construction (:func:`.probe.fresh_prompt`), and only the golden pass may then start with hits."""
    if not (result.get("features") or {}).get("prefix_cache"):
        notes.append(
            f"engine {result.get('engine')} has no prefix cache: the consistency check asks each prompt 3 times"
        )
        return
    notes.extend(result.get("flush_problems") or [])
    problems = []
    if all(not row.get("cached_tokens") for row in rows):
        problems.append("the server reported no cached tokens for the consistency prompts' hits")
    checks.append({"name": "cache_hit_checked", "value": not problems, "op": "==", "limit": True,
                   "ok": not problems or not cfg.require_cache_hit})  # fmt: skip
    if not problems:
        return
    said = "; ".join(problems) + ": no cache hit was checked against a miss"
    if cfg.require_cache_hit:
        reasons.append(f"{said} (if this engine runs without a prefix cache on purpose, set {CACHE_VARIABLE}=false)")
    else:
        notes.append(f"{said} ({CACHE_VARIABLE} is false)")


def _eval_against_reference(
    ev: dict[str, Any], ref_eval: dict[str, Any], cfg: GateConfig
) -> tuple[dict[str, Any], str | None]:
    """The eval against the last-known-good's (:mod:`.eval_compare`): the check, and the reason when refused."""
    answers = ref_eval.get("answers")
    paired = isinstance(answers, dict) and bool(answers)
    if paired:
        worse, better, questions = paired_counts(answers, ev.get("items") or [])
    else:
        worse, better, questions = counts_from_totals(int(ref_eval["correct"]), int(ev.get("correct") or 0),
                                                      int(ev.get("count") or 0))  # fmt: skip
    p_value = sign_test_p(worse, better)
    drop = round((worse - better) / questions, 4) if questions else 0.0
    ok = not refuses(worse, better, questions, cfg.eval_margin_pct, cfg.eval_confidence)
    check = {"name": "eval_score_vs_last_known_good", "value": ev.get("score"), "baseline": ref_eval.get("score"),
             "paired": paired, "questions": questions, "worse": worse, "better": better, "drop": drop,
             "p_value": round(p_value, 6), "confidence": cfg.eval_confidence, "op": "not refused",
             "limit": round(cfg.eval_margin_pct / 100.0, 4), "ok": ok}  # fmt: skip
    if ok:
        return check, None
    how = "question by question" if paired else "from the totals (the record predates its answers)"
    return check, (
        f"eval: {worse} questions the last-known-good answered right are wrong now and {better} the other way "
        f"round ({how}; {ev.get('correct')} against {ref_eval.get('correct')} of {questions}): a drop of "
        f"{drop * 100:.1f} points, more than eval_margin_pct {cfg.eval_margin_pct:g}, and confidently worse "
        f"(one-sided sign test p = {p_value:.4f} <= {1 - cfg.eval_confidence:.2f})"
    )


def next_record(
    kept: dict[str, Any] | None, new: dict[str, Any] | None, accepted: bool = False
) -> dict[str, Any] | None:
    """The correctness record the last-known-good keeps once a gate passed: the ``kept`` one while it
    holds this probe set's outputs of this model revision (the reference does not move with each
    engine or flag kept), unless the change of outputs was ``accepted`` or it is of an older
    :data:`RECORD_SCHEMA` (without answers and re-scores: the gate that passed against it holds them);
    else this gate's (``new``)."""
    if new is None:
        return kept or None
    same = (
        bool(kept)
        and kept.get("schema") == RECORD_SCHEMA
        and (kept.get("probe") or {}).get("digest") == (new.get("probe") or {}).get("digest")
        and kept.get("model_revision") == new.get("model_revision")
    )
    return dict(kept) if same and not accepted else dict(new)


def summary_part(result: dict[str, Any] | None, checks: list[dict[str, Any]]) -> str | None:
    """``right: golden 5/5, consistency 3/3, eval 20/20 (min 0.8)`` for the summary line; None without a probe."""
    if not result:
        return None
    parts = []
    by_name = {check["name"]: check for check in checks}
    golden = by_name.get("golden_outputs")
    if golden:
        parts.append(f"golden {sum(1 for r in golden['prompts'] if r['ok'])}/{len(golden['prompts'])}")
    consistency = by_name.get("consistency")
    if consistency:
        parts.append(f"consistency {consistency['value']}/{consistency['limit']}")
    ev = result.get("eval") or {}
    if ev.get("count"):
        limit = by_name.get("eval_score", {}).get("limit")
        parts.append(f"eval {ev.get('correct')}/{ev.get('count')}" + (f" (min {limit:g})" if limit else ""))
    return "right: " + ", ".join(parts) if parts else None
