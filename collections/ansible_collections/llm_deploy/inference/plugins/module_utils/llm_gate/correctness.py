# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""Whether the server says the right things: the correctness half of the verdict (:mod:`.verdict` calls it).

Three checks over what :func:`.probe.run_probe` brought back, and a fourth against the record:

* ``golden_outputs``: the golden prompts' outputs against the last-known-good's, when it was
  recorded with the same probe set on the same model revision. A prompt passes when its tokens
  (text, where the engine gives no ids) are the same, or, where the engine re-scored the
  reference's tokens (teacher forcing), when they part at a near-tie (this server ranks the
  reference's token within ``tie_margin`` of its own choice) and the reference's tokens drift by
  at most ``max_logprob_drift`` on average: a kernel change that flips a near-tie is told apart
  from a broken server, whose drift is large. At least ``golden_min_match_share`` of the prompts
  must pass.
* ``consistency``: each consistency prompt asked as a cache miss (the golden pass, after a flush),
  a hit, and a repeat. The repeat must give the hit's tokens exactly (greedy decoding that is not
  deterministic is a failure, not noise); the hit must give the miss's, or part from it at a
  near-tie with the log-probabilities before it within the drift bound.
* ``eval_score``: the share of the generated questions answered exactly, at least ``min_eval_score``.
* ``eval_score_vs_last_known_good``: against the last-known-good's score (same probe set, any model
  revision): the Wilson lower bound of this score at ``eval_confidence`` must reach the reference's
  score less ``eval_margin_pct`` percent (vLLM's accuracy gate, in its mode for small samples).

``accept_output_change`` lets the golden outputs and the relative score differ on purpose (the
new outputs become the reference); the floor and the consistency check still apply.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .config import GateConfig

ACCEPT_VARIABLE = "health_gate_accept_output_change"
# The one-sided normal quantiles of the confidences the gate accepts (NormalDist is not in 3.6-3.7).
_Z = {0.8: 0.8416, 0.9: 1.2816, 0.95: 1.6449, 0.975: 1.96, 0.99: 2.3263}
CONFIDENCES = tuple(sorted(_Z))


def wilson_lower(correct: int, count: int, confidence: float = 0.95) -> float:
    """The one-sided Wilson score lower bound of ``correct`` successes in ``count`` trials.

    >>> round(wilson_lower(20, 20, 0.95), 3)
    0.881
    """
    if count <= 0:
        return 0.0
    z = _Z[confidence]
    p = correct / count
    denom = 1 + z * z / count
    center = (p + z * z / (2 * count)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / count + z * z / (4 * count * count))
    return max(0.0, min(1.0, center - half))


def record_of(result: dict[str, Any], model_revision: str | None) -> dict[str, Any]:
    """What the last-known-good keeps of a probe: the probe set, the model revision, the eval's
    score and each golden output (text, and token ids and their log-probabilities where given; a
    conversation's later turn also the texts of the turns before it that it was asked on)."""
    golden = {}
    for key, value in (result.get("golden") or {}).items():
        golden[key] = {
            name: value[name] for name in ("text", "token_ids", "logprobs", "prior") if value.get(name) is not None
        }
    ev = result.get("eval") or {}
    return {
        "probe": result.get("probe"),
        "model_revision": model_revision,
        "eval": {"score": ev.get("score"), "correct": ev.get("correct"), "count": ev.get("count")},
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


def _mean_drift(ours: list[Any], theirs: list[Any], upto: int | None = None) -> float | None:
    """The mean absolute difference of two log-probability lists (up to index ``upto``), None when unknown."""
    pairs = [(x, y) for x, y in zip(ours, theirs) if x is not None and y is not None][:upto]  # noqa: B905
    if not pairs:
        return None
    return round(sum(abs(x - y) for x, y in pairs) / len(pairs), 4)


def compare_golden(
    reference: dict[str, Any], output: dict[str, Any], rescored: dict[str, Any] | None, cfg: GateConfig
) -> dict[str, Any]:
    """One golden prompt against the reference's output: same, a near-tie (re-scored), or different."""
    ref_seq, our_seq, unit = _sequences(reference, output)
    first = _first_difference(ref_seq, our_seq)
    row: dict[str, Any] = {"same": first is None, "first_divergence": first, "unit": unit}
    if rescored and reference.get("logprobs"):
        drift = _mean_drift(rescored["logprobs"], reference["logprobs"])
        row["drift"] = drift
        if first is not None and unit == "token" and first < len(rescored["logprobs"]):
            top, got = rescored["top"][first], rescored["logprobs"][first]
            row["margin_at_divergence"] = None if top is None or got is None else round(top - got, 4)
        within = drift is not None and drift <= cfg.max_logprob_drift
        margin = row.get("margin_at_divergence")
        row["near_tie"] = first is not None and within and margin is not None and margin <= cfg.tie_margin
        row["ok"] = within and (first is None or row["near_tie"])
    else:
        row["ok"] = first is None
    return row


def _consistency_row(item: dict[str, Any], cfg: GateConfig) -> dict[str, Any]:
    """Miss, hit and repeat of one prompt: the repeat must equal the hit; the hit the miss, or part at a near-tie."""
    miss, hit, again = item["miss"], item["hit"], item["repeat"]
    a, b, unit = _sequences(hit, again)
    repeat_at = _first_difference(a, b)
    a, b, unit = _sequences(miss, hit)
    hit_at = _first_difference(a, b)
    row: dict[str, Any] = {
        "id": item["id"],
        "unit": unit,
        "hit_differs_at": hit_at,
        "repeat_differs_at": repeat_at,
        "cached_tokens": hit.get("cached_tokens"),
    }
    near_tie = False
    if hit_at is not None and unit == "token" and miss.get("margins") and hit.get("logprobs"):
        margin = miss["margins"][hit_at] if hit_at < len(miss["margins"]) else None
        drift = _mean_drift(hit["logprobs"], miss["logprobs"] or [], hit_at)
        row.update(margin_at_divergence=margin, drift=drift)
        near_tie = margin is not None and margin <= cfg.tie_margin and (drift or 0.0) <= cfg.max_logprob_drift
    row["near_tie"] = near_tie
    row["ok"] = repeat_at is None and (hit_at is None or near_tie)
    return row


def _where(rows: list[dict[str, Any]], key: str) -> str:
    """``code from token 3, doc/2 from character 10`` for the rows that are not ok."""
    return ", ".join(f"{row['id']} from {row['unit']} {row[key]}" for row in rows)


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
            notes.append(f"golden outputs differ on purpose ({ACCEPT_VARIABLE}): {_where(rows, 'first_divergence')}")
        elif not ok:
            bad = [row for row in rows if not row["ok"]]
            rescoring = (
                ""
                if result.get("rescored")
                else ", and the engine cannot re-score them to tell a near-tie from a broken server"
            )
            where = _where(bad, "first_divergence")
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
        flaky = [row for row in rows if row["repeat_differs_at"] is not None]
        moved = [row for row in rows if row["repeat_differs_at"] is None and not row["ok"]]
        if flaky:
            reasons.append(
                "greedy decoding is not deterministic: asked again in the same cache state, "
                f"{_where(flaky, 'repeat_differs_at')} gave other output"
            )
        if moved:
            reasons.append(
                f"a cache hit changed the output ({_where(moved, 'hit_differs_at')}), not at a near-tie "
                f"(tie_margin {cfg.tie_margin:g}): the prefix cache serves other state than a miss computes"
            )
        if not (result.get("features") or {}).get("prefix_cache"):
            notes.append(
                f"engine {result.get('engine')} has no prefix cache: the consistency check asks each prompt 3 times"
            )
        elif all(not row.get("cached_tokens") for row in rows):
            notes.append("the server reported no cached tokens for the consistency prompts: no cache hit was checked")

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
    if score is not None and ref_eval.get("score") is not None and cfg.eval_margin_pct > 0:
        lower = round(wilson_lower(correct, count, cfg.eval_confidence), 4)
        needed = round(ref_eval["score"] * (1 - cfg.eval_margin_pct / 100.0), 4)
        ok = lower >= needed
        check = {"name": "eval_score_vs_last_known_good", "value": score, "wilson_lower": lower,
                 "confidence": cfg.eval_confidence, "baseline": ref_eval["score"], "op": ">=", "limit": needed,
                 "ok": ok}  # fmt: skip
        if not ok and accepted:
            check.update(ok=True, accepted=True)
            notes.append(f"eval score below the last-known-good's on purpose ({ACCEPT_VARIABLE})")
        elif not ok:
            reasons.append(
                f"eval score {score:.2f} ({correct} of {count}; Wilson lower bound {lower:.2f} at "
                f"{cfg.eval_confidence:g}) is below the last-known-good's {ref_eval['score']:.2f} less "
                f"eval_margin_pct {cfg.eval_margin_pct:g} ({needed:.2f}): {how_to_accept}"
            )
        checks.append(check)
    return checks, reasons, notes


def next_record(
    kept: dict[str, Any] | None, new: dict[str, Any] | None, accepted: bool = False
) -> dict[str, Any] | None:
    """The correctness record the last-known-good keeps once a gate passed: the ``kept`` one while it
    holds this probe set's outputs of this model revision (the reference does not move with each
    engine or flag kept), unless the change of outputs was ``accepted``; else this gate's (``new``)."""
    if new is None:
        return kept or None
    same = (
        bool(kept)
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
