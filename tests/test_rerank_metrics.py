"""The rerank benchmark's metrics (benchmarks/harness/rerank_metrics.py): plain Python, no
engine."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from harness.rerank_metrics import (  # noqa: E402
    bootstrap_ci,
    ndcg_at_k,
    paired_difference,
    rank_order,
    ranking_metrics,
    reciprocal_rank,
    summarize,
)


def test_rank_order_best_first_ties_in_input_order():
    assert rank_order([0.1, 0.9, 0.5, 0.9]) == [1, 3, 2, 0]
    assert rank_order([]) == []


def test_ndcg_perfect_worst_and_hand_computed():
    assert ndcg_at_k([True, True, False, False], k=10) == pytest.approx(1.0)
    assert ndcg_at_k([False, False, False], k=10) == 0.0
    # one relevant document at rank 3 (1-based): 1/log2(4) over the ideal 1/log2(2)
    assert ndcg_at_k([False, False, True], k=10) == pytest.approx(0.5)
    # two relevant, at ranks 1 and 3: (1 + 1/2) / (1 + 1/log2(3))
    expected = (1 + 0.5) / (1 + 1 / math.log2(3))
    assert ndcg_at_k([True, False, True, False], k=10) == pytest.approx(expected)


def test_ndcg_cutoff_and_relevant_outside_the_list():
    # relevant only below the cut-off: 0
    assert ndcg_at_k([False, False, True], k=2) == 0.0
    # the ideal counts every relevant document of the pool (up to k), ranked or not
    assert ndcg_at_k([True, False], k=10, n_relevant=2) == pytest.approx(1 / (1 + 1 / math.log2(3)))
    # more relevant than k: the ideal is k relevant ranks
    assert ndcg_at_k([True] * 12, k=10) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        ndcg_at_k([True], k=0)
    with pytest.raises(ValueError):
        ndcg_at_k([True, True], k=10, n_relevant=1)


def test_reciprocal_rank():
    assert reciprocal_rank([True, False]) == 1.0
    assert reciprocal_rank([False, False, True]) == pytest.approx(1 / 3)
    assert reciprocal_rank([False, False]) == 0.0


def test_ranking_metrics_ranks_by_score():
    scores = [0.2, 0.9, 0.5, 0.1]
    relevant = [False, False, True, False]  # ranked second
    metrics = ranking_metrics(scores, relevant, k=10)
    assert metrics["mrr"] == pytest.approx(0.5)
    assert metrics["ndcg"] == pytest.approx(1 / math.log2(3))
    with pytest.raises(ValueError):
        ranking_metrics([0.1], [True, False])


def test_bootstrap_ci_contains_the_mean_and_is_reproducible():
    values = [0.0, 1.0] * 20
    low, high = bootstrap_ci(values, iters=500, seed=3)
    assert low < 0.5 < high
    assert 0.25 < low and high < 0.75  # a 95% interval of 40 coin flips' mean
    assert bootstrap_ci(values, iters=500, seed=3) == (low, high)
    assert bootstrap_ci([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7))
    assert bootstrap_ci([0.4]) == (0.4, 0.4)
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_summarize_and_paired_difference():
    s = summarize([0.2, 0.4, 0.6], iters=300)
    assert s["mean"] == pytest.approx(0.4)
    assert s["std"] == pytest.approx(0.2)
    assert s["n"] == 3
    assert s["ci_low"] <= s["mean"] <= s["ci_high"]
    # a constant per-query gain has no spread, whatever the queries' own spread
    d = paired_difference([0.9, 0.3, 0.6], [0.8, 0.2, 0.5], iters=300)
    assert d["mean"] == pytest.approx(0.1)
    assert d["ci_low"] == pytest.approx(0.1) and d["ci_high"] == pytest.approx(0.1)
    with pytest.raises(ValueError):
        paired_difference([0.1], [0.1, 0.2])
