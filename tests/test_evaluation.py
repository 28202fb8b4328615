"""The pipelines' quality metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from prefillonly_sgl.verification import quality_metrics as ev


def test_accuracy_and_confusion():
    truth, predicted = ["a", "b", "b", "c"], ["a", "b", "a", "c"]
    assert ev.accuracy(truth, predicted) == 0.75
    assert ev.confusion_matrix(truth, predicted, ["a", "b", "c"]) == [
        [1, 0, 0],
        [1, 1, 0],
        [0, 0, 1],
    ]
    assert "truth \\ predicted" in ev.format_confusion([[1, 0], [0, 1]], ["a", "b"])
    with pytest.raises(ValueError):
        ev.accuracy([], [])
    # recalls a 1/1, b 1/2, c 1/1
    assert ev.balanced_accuracy(truth, predicted) == pytest.approx((1 + 0.5 + 1) / 3)
    assert ev.balanced_accuracy(["a", "a", "a", "b"], ["a"] * 4) == 0.5


def test_roc_auc_counts_pairs_and_ties_half():
    assert ev.roc_auc([True, False], [0.9, 0.1]) == 1.0
    assert ev.roc_auc([True, False], [0.1, 0.9]) == 0.0
    assert ev.roc_auc([True, False, True, False], [0.5, 0.5, 0.8, 0.2]) == 0.875
    with pytest.raises(ValueError, match="both"):
        ev.roc_auc([True, True], [0.1, 0.2])


def test_hit_rate_and_ndcg():
    lists = [[False, True, False], [True, False, False], [False, False, True]]
    assert ev.hit_rate_at_k(lists, 1) == pytest.approx(1 / 3)
    assert ev.hit_rate_at_k(lists, 2) == pytest.approx(2 / 3)
    assert ev.ndcg_at_k(lists, 3) == pytest.approx((1 / math.log2(3) + 1 + 1 / math.log2(4)) / 3)
