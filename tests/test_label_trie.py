"""The label trie (plain Python): which forwards a label set needs, and how their log-probs
combine into label scores."""

from __future__ import annotations

import math

import pytest

from prefillonly_sgl.scoring.label_trie import build_trie, label_scores, sequence_logprobs


def test_single_token_labels_need_only_the_root():
    trie = build_trie([[5], [9], [2]])
    assert trie.one_token_labels
    assert trie.nodes == ((),)
    assert trie.next_tokens == {(): (5, 9, 2)}
    assert trie.continuations == ()


def test_shared_first_tokens_share_their_node():
    # "very good", "very bad", "ok", "not at all"
    trie = build_trie([[7, 1], [7, 2], [3], [4, 5, 6]])
    assert not trie.one_token_labels
    assert trie.nodes == ((), (7,), (4,), (4, 5))
    assert trie.next_tokens == {(): (7, 3, 4), (7,): (1, 2), (4,): (5,), (4, 5): (6,)}
    assert trie.continuations == ((7,), (4,), (4, 5))


def test_a_label_may_be_the_prefix_of_another():
    trie = build_trie([[7], [7, 8]])
    assert trie.nodes == ((), (7,))
    assert trie.next_tokens == {(): (7,), (7,): (8,)}
    logprobs = sequence_logprobs(trie, {(): [-1.0], (7,): [-0.5]})
    assert logprobs == [-1.0, -1.5]


def test_sequence_logprobs_sum_the_factors_along_each_label():
    trie = build_trie([[7, 1], [7, 2], [3], [4, 5, 6]])
    node = {(): [-0.1, -2.0, -3.0], (7,): [-0.2, -1.7], (4,): [-0.3], (4, 5): [-0.4]}
    assert sequence_logprobs(trie, node) == pytest.approx([-0.3, -1.8, -2.0, -3.7])


def test_a_node_without_one_logprob_per_token_is_an_error():
    trie = build_trie([[7, 1], [3]])
    with pytest.raises(ValueError):
        sequence_logprobs(trie, {(): [-0.1], (7,): [-0.2]})


def test_scores_normalised_raw_and_length_normalised():
    logprobs = [math.log(0.2), math.log(0.05)]
    assert label_scores(logprobs, [1, 2]) == pytest.approx([0.8, 0.2])
    assert label_scores(logprobs, [1, 2], apply_softmax=False) == pytest.approx([0.2, 0.05])
    # per token: 0.2 vs sqrt(0.05) = 0.2236
    raw = label_scores(logprobs, [1, 2], apply_softmax=False, length_normalize=True)
    assert raw == pytest.approx([0.2, math.sqrt(0.05)])
    normed = label_scores(logprobs, [1, 2], length_normalize=True)
    assert normed == pytest.approx(
        [0.2 / (0.2 + math.sqrt(0.05)), math.sqrt(0.05) / (0.2 + math.sqrt(0.05))]
    )


def test_normalising_tiny_probabilities_does_not_underflow():
    scores = label_scores([-900.0, -901.0], [3, 3])
    assert scores == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])
    assert label_scores([-900.0, -901.0], [3, 3], apply_softmax=False) == [0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        label_scores([-math.inf, -math.inf], [1, 2])
