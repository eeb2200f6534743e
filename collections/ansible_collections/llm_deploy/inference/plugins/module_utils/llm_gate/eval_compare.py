# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The eval against the last-known-good's, question by question: a paired rule that never fails a server against itself.

Both servers answered the same generated questions. Only the questions they answered
differently (the *discordant* ones) say which is better: ``worse`` questions the reference got
right and the candidate wrong, ``better`` the other way round. The candidate is refused when both
hold:

* it is **confidently worse**: the exact one-sided sign test on the discordant questions
  (McNemar's exact test), ``P(X >= worse | X ~ Binomial(worse + better, 1/2))``, is at most
  ``1 - confidence``;
* and worse **by more than the margin**: ``(worse - better) / questions`` exceeds
  ``margin_pct`` percentage points of accuracy.

An unchanged server answers every question as it did (``worse == better == 0``): the sign test's
p-value is 1 and the net drop 0, so it passes at any score and any number of questions, by
construction. A reference recorded before answers were kept (only its count of right answers) is
compared with the fewest discordant questions its totals allow (:func:`counts_from_totals`).

:func:`refusal_probability` and :func:`smallest_refused_drop` compute, exactly, how often the rule
refuses a candidate of a given accuracy: docs/health-gate.md's table per profile
(``tools/probe-set power-table``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

# How the answers of the two servers relate, for the power table: "independent" (every question
# can be discordant: the hardest case for a paired test) or "degraded" (the candidate loses some of
# the reference's right answers and gains none: the easiest).
MODELS = ("independent", "degraded")


def sign_test_p(worse: int, better: int) -> float:
    """The exact one-sided p-value that the candidate is worse: ``P(X >= worse)``, ``X ~ Bin(worse + better, 1/2)``.

    >>> sign_test_p(0, 0), sign_test_p(1, 0), sign_test_p(6, 0)
    (1.0, 0.5, 0.015625)
    """
    discordant = worse + better
    if discordant == 0 or worse == 0:
        return 1.0
    tail = sum(math.comb(discordant, k) for k in range(worse, discordant + 1))
    return tail / 2.0**discordant


def _refused(worse: int, better: int, questions: int, p_value: float, margin_pct: float, confidence: float) -> bool:
    """The rule, given the sign test's p-value: worse by more than the margin, and confidently."""
    drop = (worse - better) / questions
    return drop > margin_pct / 100.0 + 1e-12 and p_value <= 1.0 - confidence + 1e-12


def refuses(worse: int, better: int, questions: int, margin_pct: float, confidence: float) -> bool:
    """Whether the rule refuses a candidate with these discordant counts (the module's docstring)."""
    if questions <= 0 or worse <= better:
        return False
    return _refused(worse, better, questions, sign_test_p(worse, better), margin_pct, confidence)


def paired_counts(reference: dict[str, bool], rows: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(worse, better, questions) over the questions both answered: ``reference`` maps a question's id
    to whether the last-known-good got it right; ``rows`` are this probe's eval rows (id, right)."""
    worse = better = questions = 0
    for row in rows:
        if row.get("id") not in reference:
            continue
        questions += 1
        was, now = bool(reference[row["id"]]), bool(row.get("right"))
        worse += was and not now
        better += now and not was
    return worse, better, questions


def counts_from_totals(reference_correct: int, correct: int, questions: int) -> tuple[int, int, int]:
    """(worse, better, questions) when only the totals of right answers are known: the fewest
    discordant questions they allow (one side's surplus, none on the other)."""
    return max(0, reference_correct - correct), max(0, correct - reference_correct), questions


@functools.lru_cache(maxsize=64)
def _least_refused_worse(questions: int, margin_pct: float, confidence: float) -> tuple[int | None, ...]:
    """For each number of discordant questions m (0..questions), the fewest ``worse`` of them that
    the rule refuses (it refuses every larger number too), or None when none is refused."""
    least: list[int | None] = []
    for discordant in range(questions + 1):
        found, tail, term = None, 0, 1  # term: comb(discordant, worse), from worse == discordant down
        for worse in range(discordant, discordant // 2, -1):
            tail += term
            term = term * worse // (discordant - worse + 1)
            if not _refused(worse, discordant - worse, questions, tail / 2**discordant, margin_pct, confidence):
                break
            found = worse
        least.append(found)
    return tuple(least)


def _binomial_pmf(count: int, prob: float, k: int) -> float:
    """``P(X == k)`` for ``X ~ Binomial(count, prob)``."""
    if prob <= 0.0 or prob >= 1.0:
        return float(k == (count if prob >= 1.0 else 0))
    log = math.lgamma(count + 1) - math.lgamma(k + 1) - math.lgamma(count - k + 1)
    return math.exp(log + k * math.log(prob) + (count - k) * math.log1p(-prob))


def _binomial_tail(count: int, prob: float, at_least: int) -> float:
    """``P(X >= at_least)`` for ``X ~ Binomial(count, prob)``."""
    return sum(_binomial_pmf(count, prob, k) for k in range(max(0, at_least), count + 1))


def refusal_probability(
    questions: int, reference_accuracy: float, candidate_accuracy: float, margin_pct: float, confidence: float,
    model: str = "independent",
) -> float:  # fmt: skip
    """The exact probability that the rule refuses a candidate of ``candidate_accuracy`` against a
    reference of ``reference_accuracy`` on ``questions`` questions, under ``model`` (:data:`MODELS`).

    ``independent``: each question's two answers are independent draws at the two accuracies.
    ``degraded``: the reference answered ``round(questions * reference_accuracy)`` right, and the
    candidate loses each of those with the probability that brings it to ``candidate_accuracy``.
    """
    least = _least_refused_worse(questions, margin_pct, confidence)
    if model == "degraded":
        right = round(questions * reference_accuracy)
        lose = min(1.0, max(0.0, (reference_accuracy - candidate_accuracy) / reference_accuracy)) if right else 0.0
        # No better question: the discordant ones are the lost ones, refused from least[worse] == worse on.
        first = next((w for w in range(1, right + 1) if least[w] == w), None)
        return 0.0 if first is None else min(1.0, _binomial_tail(right, lose, first))
    p_worse = reference_accuracy * (1 - candidate_accuracy)
    p_better = (1 - reference_accuracy) * candidate_accuracy
    p_discordant = p_worse + p_better
    if p_discordant <= 0.0:
        return 0.0
    total = 0.0
    for discordant, worse in enumerate(least):
        if worse is not None:
            weight = _binomial_pmf(questions, p_discordant, discordant)
            total += weight * _binomial_tail(discordant, p_worse / p_discordant, worse)
    return min(1.0, total)


def smallest_refused_drop(
    questions: int, reference_accuracy: float, margin_pct: float, confidence: float, model: str = "independent",
    power: float = 0.9, step: float = 0.01,
) -> float | None:  # fmt: skip
    """The smallest drop of accuracy (a multiple of ``step``) that the rule refuses with at least
    ``power`` probability; None when even a candidate that answers nothing right is not."""
    steps = int(round(reference_accuracy / step))
    for n in range(1, steps + 1):
        drop = round(n * step, 6)
        candidate = max(0.0, reference_accuracy - drop)
        if refusal_probability(questions, reference_accuracy, candidate, margin_pct, confidence, model) >= power:
            return drop
    return None
