"""Ranking-quality metrics of the rerank benchmark (plain Python, no engine): nDCG@k and
reciprocal rank with binary relevance, the ranking order of scores, and bootstrap
confidence intervals over queries (of a mean, and of a paired difference of means)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence


def rank_order(scores: Sequence[float]) -> list[int]:
    """Indices of ``scores`` best first; ties keep input order (as the DSL's Ranking)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])


def ndcg_at_k(relevant: Sequence[bool], k: int = 10, n_relevant: int | None = None) -> float:
    """nDCG@k of one ranking, binary relevance: ``relevant[r]`` tells whether the document
    at rank r (0 = first) is relevant. DCG = sum over the first k ranks of rel / log2(r + 2);
    the ideal DCG puts min(n_relevant, k) relevant documents first (n_relevant: how many
    relevant documents the pool holds; default: those in ``relevant``). 0.0 when there is
    nothing relevant."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    total = sum(bool(r) for r in relevant) if n_relevant is None else n_relevant
    if total < sum(bool(r) for r in relevant):
        raise ValueError(f"n_relevant={n_relevant} is less than the relevant ranks given")
    ideal = sum(1.0 / math.log2(r + 2) for r in range(min(total, k)))
    if ideal == 0.0:
        return 0.0
    dcg = sum(1.0 / math.log2(r + 2) for r, rel in enumerate(relevant[:k]) if rel)
    return dcg / ideal


def reciprocal_rank(relevant: Sequence[bool]) -> float:
    """1 / the rank (1-based) of the first relevant document; 0.0 if none is relevant."""
    for r, rel in enumerate(relevant):
        if rel:
            return 1.0 / (r + 1)
    return 0.0


def ranking_metrics(
    scores: Sequence[float], is_relevant: Sequence[bool], k: int = 10
) -> dict[str, float]:
    """{"ndcg": nDCG@k, "mrr": reciprocal rank} of one query: documents ranked by
    ``scores`` (higher first, ties in input order), ``is_relevant`` in input order."""
    if len(scores) != len(is_relevant):
        raise ValueError(f"{len(scores)} scores for {len(is_relevant)} documents")
    ranked = [bool(is_relevant[i]) for i in rank_order(scores)]
    return {"ndcg": ndcg_at_k(ranked, k), "mrr": reciprocal_rank(ranked)}


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linear between the closest ranks."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def bootstrap_ci(
    values: Sequence[float], iters: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampled with
    replacement, ``iters`` times, a fixed seed); (v, v) for a single value."""
    if not values:
        return (math.nan, math.nan)
    if len(values) == 1:
        return (float(values[0]), float(values[0]))
    rng = random.Random(seed)
    n = len(values)
    means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(iters))
    tail = (1 - level) / 2
    return (_percentile(means, tail), _percentile(means, 1 - tail))


def summarize(values: Sequence[float], iters: int = 2000, seed: int = 0) -> dict[str, float]:
    """mean, std (sample; 0 for one value), bootstrap 95% interval of the mean, n."""
    low, high = bootstrap_ci(values, iters, seed=seed)
    return {
        "mean": statistics.fmean(values) if values else math.nan,
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "ci_low": low,
        "ci_high": high,
        "n": len(values),
    }


def paired_difference(
    a: Sequence[float], b: Sequence[float], iters: int = 2000, seed: int = 0
) -> dict[str, float]:
    """mean(a - b) over paired per-query values, with its bootstrap 95% interval (the
    queries resampled together, so the spread shared by both systems cancels)."""
    if len(a) != len(b):
        raise ValueError(f"paired values of different lengths: {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    low, high = bootstrap_ci(diffs, iters, seed=seed)
    return {"mean": statistics.fmean(diffs) if diffs else math.nan, "ci_low": low, "ci_high": high}
