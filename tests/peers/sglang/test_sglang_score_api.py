"""SGLang's own Engine.score tests, ported: sgl-project/sglang test/srt/test_score_api.py
(class TestScoreAPI; Apache-2.0), rewritten for pytest with their assertions kept.

Adaptations (each also said where it applies):
- the model: SGLang runs DEFAULT_SMALL_MODEL_NAME_FOR_TEST (Llama-3.2-1B-Instruct, from the
  hub); here the session's Engine on the default model (SmolLM2-135M-Instruct, also a
  Llama), float32 on CPU, shared with test_default_model.py (`default_engine`);
- the engine starts once for the module instead of once per test (setUp/tearDown);
- the Hugging Face reference is SGLang's own computation (tokenizer(full_text), the last
  position's logits, a softmax over the label tokens) on the same folder.
"""

from __future__ import annotations

from unittest.mock import patch

import pytest
import torch

TOLERANCE = 0.01  # SGLang's: a 1% absolute difference per probability


@pytest.fixture(scope="module")
def engine(default_engine):
    return default_engine


def hf_scores(reference, query, items, label_token_ids, item_first=False):
    """test_score_api.TestScoreAPI.compute_hf_scores: a plain transformers forward per item."""
    scores = []
    for item in items:
        full_text = f"{item}{query}" if item_first else f"{query}{item}"
        inputs = reference.tokenizer(full_text, return_tensors="pt")
        with torch.no_grad():
            logits = reference.model(**inputs).logits[0, -1]
        scores.append(torch.softmax(logits[label_token_ids], dim=-1).tolist())
    return scores


def token_ids(tokenizer, tokens):
    """TestScoreAPI._get_token_ids: each text's first token id (tokenizer(...) for SGLang's
    encode_plus, which transformers 5 removed)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in tokens]


def assert_matches_hf(hf, got, case):
    """TestScoreAPI._compare_scores."""
    assert len(hf) == len(got), case
    for hf_row, row in zip(hf, got):
        assert len(hf_row) == len(row), case
        for want, score in zip(hf_row, row):
            assert abs(want - score) <= TOLERANCE, (case, want, score)
            assert 0 <= score <= 1, (case, score)
        assert sum(row) == pytest.approx(1.0, abs=1e-6), case


def assert_probability_rows(scores, n_items, n_labels):
    assert len(scores) == n_items
    for row in scores:
        assert len(row) == n_labels
        assert all(isinstance(v, float) for v in row)
        assert sum(row) == pytest.approx(1.0, abs=1e-6)


def test_score_consistency(engine, default_reference):
    """TestScoreAPI.test_score_consistency: Engine.score equals the transformers forward."""
    cases = [
        ("default case", "I pledge allegiance", ["", " to"], False),
        ("item_first case", " is a city", ["Tokyo", "Japan"], True),
    ]
    labels = token_ids(engine.tokenizer, [" to", " the"])
    for name, query, items, item_first in cases:
        got = engine.score(
            query=query,
            items=items,
            label_token_ids=labels,
            apply_softmax=True,
            item_first=item_first,
        )
        assert_matches_hf(hf_scores(default_reference, query, items, labels, item_first), got, name)


def test_score_batch_handling(engine):
    """TestScoreAPI.test_score_batch_handling."""
    for batch_size in (1, 2, 4, 8):
        texts = [f"test {i}" for i in range(batch_size)]
        scores = engine.score(
            query="The test was", items=texts, label_token_ids=[1, 2, 3], apply_softmax=True
        )
        assert_probability_rows(scores, batch_size, 3)


def test_score_request_construction(engine):
    """TestScoreAPI.test_score_request_construction: one request to SGLang's tokenizer
    manager, with no decode step (max_new_tokens 0), the label ids as token_ids_logprob,
    logprobs on, no streaming. The patch is SGLang's own (patch.object on the engine's
    tokenizer_manager.generate_request), so this is the real scheduler path underneath."""
    captured = []
    original = engine.tokenizer_manager.generate_request

    async def capturing(req, request=None):
        captured.append(req)
        async for out in original(req, request):
            yield out

    labels = [1, 2, 3]
    with patch.object(engine.tokenizer_manager, "generate_request", side_effect=capturing):
        scores = engine.score(
            query="What is the capital of",
            items=["France", "Germany"],
            label_token_ids=labels,
            apply_softmax=True,
        )
    assert len(scores) == 2
    assert len(captured) == 1
    request = captured[0]
    params = request.sampling_params
    if isinstance(params, list):
        params = params[0]
    max_new_tokens = (
        params.get("max_new_tokens", 0)
        if isinstance(params, dict)
        else getattr(params, "max_new_tokens", 0)
    )
    assert max_new_tokens == 0
    per_item = request.token_ids_logprob
    if per_item and isinstance(per_item[0], list):
        assert all(ids == labels for ids in per_item)
    else:
        assert per_item == labels
    assert request.return_logprob
    assert not request.stream


def test_multi_item_scoring_basic(engine):
    """TestScoreAPI.test_multi_item_scoring_basic (ids 9454 and 2753 are Qwen's "Yes" and
    "No"; here two valid ids of another vocabulary, which the assertions do not depend on)."""
    items = ["Sacramento", "San Jose", "San Francisco"]
    scores = engine.score(
        query="What is the capital of California? Answer Yes or No for each of the "
        "following options:",
        items=items,
        label_token_ids=[9454, 2753],
        apply_softmax=True,
    )
    assert_probability_rows(scores, len(items), 2)
    assert all(score >= 0 for row in scores for score in row)


def test_multi_item_scoring_consistency(engine):
    """TestScoreAPI.test_multi_item_scoring_consistency: the same call twice (the second
    from the prefix cache) gives the same scores."""
    args = dict(
        query="Choose the best option:",
        items=["Option A", "Option B", "Option C"],
        label_token_ids=[1, 2, 3],
        apply_softmax=True,
    )
    first, second = engine.score(**args), engine.score(**args)
    assert len(first) == len(second)
    for row_1, row_2 in zip(first, second):
        assert len(row_1) == len(row_2)
        assert row_1 == pytest.approx(row_2, abs=1e-6)


@pytest.mark.parametrize(
    "items", [["Single item"], ["Item 1", "Item 2"], list("ABCD"), list("XYZWVU")]
)
def test_multi_item_scoring_different_sizes(engine, items):
    """TestScoreAPI.test_multi_item_scoring_different_sizes (its subTests as parameters)."""
    labels = [1, 2, 3, 4, 5]
    scores = engine.score(
        query="Rate each option:", items=items, label_token_ids=labels, apply_softmax=True
    )
    assert_probability_rows(scores, len(items), len(labels))


def test_multi_item_scoring_empty_items(engine):
    """TestScoreAPI.test_multi_item_scoring_empty_items: no items, no rows."""
    scores = engine.score(query="Test query", items=[], label_token_ids=[1, 2], apply_softmax=True)
    assert len(scores) == 0


def test_multi_item_scoring_single_item(engine):
    """TestScoreAPI.test_multi_item_scoring_single_item."""
    scores = engine.score(
        query="Complete this sentence: The capital of France is",
        items=["Paris"],
        label_token_ids=[1, 2, 3],
        apply_softmax=True,
    )
    assert_probability_rows(scores, 1, 3)


@pytest.mark.parametrize(
    "query",
    ["Is this true?", "Choose the correct answer:", "What is the best option?",
     "Select all that apply:", ""],
)  # fmt: skip
def test_multi_item_scoring_different_queries(engine, query):
    """TestScoreAPI.test_multi_item_scoring_different_queries (an empty query included)."""
    scores = engine.score(query=query, items=["Yes", "No"], label_token_ids=[1, 2])
    assert_probability_rows(scores, 2, 2)


@pytest.mark.parametrize("labels", [[1, 2], [1, 2, 3, 4], [1], [1, 2, 3, 4, 5, 6, 7, 8]])
def test_multi_item_scoring_different_label_tokens(engine, labels):
    """TestScoreAPI.test_multi_item_scoring_different_label_tokens."""
    scores = engine.score(
        query="Choose the best option:",
        items=["Option A", "Option B"],
        label_token_ids=labels,
        apply_softmax=True,
    )
    assert_probability_rows(scores, 2, len(labels))


def test_multi_item_scoring_without_softmax(engine):
    """TestScoreAPI.test_multi_item_scoring_without_softmax."""
    items = ["Good", "Bad", "Neutral"]
    scores = engine.score(
        query="Rate each option:", items=items, label_token_ids=[1, 2, 3], apply_softmax=False
    )
    assert len(scores) == len(items)
    for row in scores:
        assert len(row) == 3
        assert all(isinstance(score, int | float) for score in row)


def test_multi_item_scoring_large_batch(engine):
    """TestScoreAPI.test_multi_item_scoring_large_batch: 20 items."""
    items = [f"Item {i}" for i in range(20)]
    scores = engine.score(
        query="Classify each item:", items=items, label_token_ids=[1, 2, 3], apply_softmax=True
    )
    assert_probability_rows(scores, 20, 3)


def test_multi_item_scoring_unicode(engine):
    """TestScoreAPI.test_multi_item_scoring_unicode."""
    scores = engine.score(
        query="选择最佳选项：",
        items=["选项A", "选项B", "选项C"],
        label_token_ids=[1, 2, 3],
        apply_softmax=True,
    )
    assert_probability_rows(scores, 3, 3)


def test_multi_item_scoring_error_handling(engine):
    """TestScoreAPI.test_multi_item_scoring_error_handling: a ValueError or TypeError (ours
    is InvalidRequestError, a ValueError naming the field)."""
    with pytest.raises((ValueError, TypeError)):
        engine.score(query="Test query", items=["Item 1", "Item 2"], label_token_ids="invalid")
    with pytest.raises((ValueError, TypeError)):
        engine.score(query="Test query", items=None, label_token_ids=[1, 2])
