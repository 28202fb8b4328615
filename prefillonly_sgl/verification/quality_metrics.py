"""Quality metrics for the pipelines (plain Python, no numpy/sklearn needed): accuracy,
ROC AUC from scores, a confusion matrix, and hit rate / NDCG at k for rankings."""

from __future__ import annotations

import math
from collections.abc import Sequence


def accuracy(truth: Sequence, predicted: Sequence) -> float:
    if len(truth) != len(predicted) or not truth:
        raise ValueError(f"need equal, non-empty lists, got {len(truth)} and {len(predicted)}")
    return sum(t == p for t, p in zip(truth, predicted)) / len(truth)


def balanced_accuracy(truth: Sequence, predicted: Sequence) -> float:
    """The mean over the true classes of the share predicted right (recall): a model that
    always answers the majority label scores 1 / classes, whatever the imbalance."""
    classes = sorted(set(truth), key=str)
    recalls = []
    for c in classes:
        members = [p for t, p in zip(truth, predicted) if t == c]
        recalls.append(sum(p == c for p in members) / len(members))
    return sum(recalls) / len(recalls)


def roc_auc(positive: Sequence[bool], scores: Sequence[float]) -> float:
    """The probability that a random positive scores above a random negative (ties count
    half): the area under the ROC curve, by ranks (Mann-Whitney U)."""
    pairs = sorted(zip(scores, positive))
    n_pos = sum(1 for _, p in pairs if p)
    n_neg = len(pairs) - n_pos
    if not n_pos or not n_neg:
        raise ValueError("ROC AUC needs both positives and negatives")
    rank_sum, i = 0.0, 0
    while i < len(pairs):  # average ranks over ties
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        mean_rank = (i + 1 + j) / 2
        rank_sum += mean_rank * sum(1 for _, p in pairs[i:j] if p)
        i = j
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def confusion_matrix(truth: Sequence, predicted: Sequence, labels: Sequence) -> list[list[int]]:
    """matrix[i][j]: how many of truth labels[i] were predicted labels[j]."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for t, p in zip(truth, predicted):
        matrix[index[t]][index[p]] += 1
    return matrix


def format_confusion(matrix: list[list[int]], labels: Sequence) -> str:
    width = max(len(str(x)) for x in labels) + 2
    head = "truth \\ predicted".ljust(18) + "".join(str(x).rjust(width) for x in labels)
    lines = [head] + [
        str(t).ljust(18) + "".join(str(n).rjust(width) for n in row)
        for t, row in zip(labels, matrix)
    ]
    return "\n".join(lines)


def hit_rate_at_k(ranked_relevance: Sequence[Sequence[bool]], k: int) -> float:
    """Share of lists (best first) with a relevant item in the top k."""
    return sum(any(r[:k]) for r in ranked_relevance) / len(ranked_relevance)


def ndcg_at_k(ranked_relevance: Sequence[Sequence[bool]], k: int) -> float:
    """Mean normalised discounted cumulative gain at k (binary relevance)."""
    total = 0.0
    for relevance in ranked_relevance:
        gain = sum(1 / math.log2(i + 2) for i, rel in enumerate(relevance[:k]) if rel)
        ideal = sum(1 / math.log2(i + 2) for i in range(min(k, sum(map(bool, relevance)))))
        total += gain / ideal if ideal else 0.0
    return total / len(ranked_relevance)
