# Copyright: the llm-deploy authors. GNU General Public License v3.0+.
"""The gate's arithmetic: percentiles, decode speed and the aggregate over the measured requests."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from .streaming import RequestResult


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Percentile with linear interpolation between closest ranks (numpy's default).

    ``percentile([1, 2, 3, 4], 50) == 2.5``; one value is its own percentile; ``None``
    for no values.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def decode_tps(completion_tokens: int, t_first: float, t_last: float) -> float | None:
    """Decode speed of one request: tokens after the first over the time after the first.

    ``None`` when it cannot be measured (one token, or all tokens in one chunk).
    """
    span = t_last - t_first
    if completion_tokens < 2 or span <= 0:
        return None
    return (completion_tokens - 1) / span


def mean_of(values: Sequence[float]) -> float | None:
    """Arithmetic mean; ``None`` for no values."""
    return statistics.mean(values) if values else None


def median_of(values: Sequence[float]) -> float | None:
    """Median; ``None`` for no values."""
    return statistics.median(values) if values else None


def rounded(value: float | None, digits: int = 4) -> float | None:
    """``value`` as a float rounded to ``digits`` (``None`` stays ``None``)."""
    return None if value is None else round(float(value), digits)


def aggregate(results: Sequence[RequestResult], wall_s: float) -> dict[str, Any]:
    """Aggregate figures over the measured requests.

    Decode tok/s is the mean (and median) of the per-request figures; ``total_tps`` is
    all completion tokens over the wall time of the measurement (it grows with
    concurrency, the per-request figure does not). Inter-token latency pools the gaps
    between content chunks of every request.
    """
    tps = [r.decode_tps for r in results if r.decode_tps is not None]
    ttft = [r.ttft_s for r in results]
    e2e = [r.e2e_s for r in results]
    gaps = [g for r in results for g in r.gaps]
    completion = sum(r.completion_tokens for r in results)
    prompt = sum(r.prompt_tokens for r in results)
    chunks = sum(r.content_chunks for r in results)
    return {
        "requests": len(results),
        "requests_with_decode": len(tps),
        "decode_tps_mean": rounded(mean_of(tps), 3),
        "decode_tps_median": rounded(median_of(tps), 3),
        "decode_tps_min": rounded(min(tps) if tps else None, 3),
        "decode_tps_max": rounded(max(tps) if tps else None, 3),
        "ttft_p50_s": rounded(percentile(ttft, 50)),
        "ttft_p95_s": rounded(percentile(ttft, 95)),
        "ttft_max_s": rounded(max(ttft) if ttft else None),
        "itl_mean_s": rounded(mean_of(gaps), 5),
        "itl_p95_s": rounded(percentile(gaps, 95), 5),
        "e2e_p50_s": rounded(percentile(e2e, 50)),
        "e2e_p95_s": rounded(percentile(e2e, 95)),
        "completion_tokens": completion,
        "prompt_tokens": prompt,
        "tokens_per_chunk": rounded(completion / chunks if chunks else None, 3),
        "wall_s": rounded(wall_s, 3),
        "total_tps": rounded(completion / wall_s if wall_s > 0 else None, 3),
    }
