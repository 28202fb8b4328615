"""SGLang's Engine.score tests across model architectures, ported:
sgl-project/sglang test/registered/core/test_score_api_multi_arch.py (class
TestScoreAPIMultiArch; Apache-2.0), rewritten for pytest with their assertions kept.

Adaptations:
- the models: SGLang's CI runs hub checkpoints on a GPU. Here each architecture is a local
  one: "causallm_llama" (Llama-3.2-1B-Instruct there) is the default model
  (SmolLM2-135M-Instruct, a Llama); "causallm_llama_base" (Llama-3.2-1B) is the suite's
  tiny random Llama; "causallm_qwen" (Qwen2.5-1.5B-Instruct) the tiny random Qwen2. Each
  is the session's engine (one start for the suite), not one engine per test;
- "sequence_classification_qwen3" (Qwen3-Reranker-0.6B with a classification head) is
  skipped: it needs that trained checkpoint, which cannot be installed here;
- the Hugging Face reference is SGLang's own computation (_compute_hf_scores_causallm) on
  the same folder, with tokenizer(...) for encode_plus (removed in transformers 5).
"""

from __future__ import annotations

import pytest
import torch

from prefillonly_sgl.verification.reference import TransformersReference


@pytest.fixture(scope="module")
def architectures(default_engine, default_reference, tiny_engine, tiny_llama_path,
                  tiny_qwen2_engine, tiny_qwen2_path):  # fmt: skip
    """SGLang's TEST_MODELS: name -> (engine, reference) on a local model of that family."""
    return {
        "causallm_llama": (default_engine, default_reference),
        "causallm_llama_base": (tiny_engine, TransformersReference(tiny_llama_path)),
        "causallm_qwen": (tiny_qwen2_engine, TransformersReference(tiny_qwen2_path)),
    }


@pytest.fixture(scope="module")
def llama(architectures):
    return architectures["causallm_llama"]


def token_ids(tokenizer, tokens):
    """TestScoreAPIMultiArch._get_token_ids: each text's first token id, if it has one."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in tokens]
    return [i[0] for i in ids if i]


def hf_scores(reference, query, items, label_token_ids, apply_softmax=False, item_first=False):
    """TestScoreAPIMultiArch._compute_hf_scores_causallm."""
    scores = []
    for item in items:
        full_text = f"{item}{query}" if item_first else f"{query}{item}"
        inputs = reference.tokenizer(full_text, return_tensors="pt")
        with torch.no_grad():
            target = reference.model(**inputs).logits[0, -1][label_token_ids]
        scores.append((torch.softmax(target, dim=-1) if apply_softmax else target).tolist())
    return scores


def assert_close(hf, got, case, tolerance=0.01):
    """TestScoreAPIMultiArch._compare_scores."""
    assert len(hf) == len(got), case
    for hf_row, row in zip(hf, got):
        assert len(hf_row) == len(row), case
        for want, score in zip(hf_row, row):
            assert abs(want - score) <= tolerance, (case, want, score)


def _scored_like_hf(engine, reference, query, items, words, item_first=False):
    labels = token_ids(engine.tokenizer, words)
    got = engine.score(
        query=query, items=items, label_token_ids=labels, apply_softmax=True, item_first=item_first
    )
    want = hf_scores(reference, query, items, labels, apply_softmax=True, item_first=item_first)
    return want, got


def test_causallm_llama_basic_scoring(llama):
    """TestScoreAPIMultiArch.test_causallm_llama_basic_scoring."""
    want, got = _scored_like_hf(
        *llama, "The capital of France is", ["Paris", "London", "Berlin"], ["Paris", "London"]
    )
    assert_close(want, got, "Llama basic")


def test_causallm_llama_base_basic_scoring(architectures):
    """TestScoreAPIMultiArch.test_causallm_llama_base_basic_scoring."""
    want, got = _scored_like_hf(
        *architectures["causallm_llama_base"],
        "The capital of France is",
        ["Paris", "London"],
        ["Paris", "London"],
    )
    assert_close(want, got, "Llama base")


def test_causallm_item_first(llama):
    """TestScoreAPIMultiArch.test_causallm_item_first."""
    want, got = _scored_like_hf(
        *llama, " is a city", ["Tokyo", "Japan"], ["Tokyo", "Japan"], item_first=True
    )
    assert_close(want, got, "Llama item_first")


def test_causallm_without_softmax(llama):
    """TestScoreAPIMultiArch.test_causallm_without_softmax: numbers, one per label."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, ["Yes", "No"])
    scores = engine.score(
        query="The answer is", items=["Yes", "No"], label_token_ids=labels, apply_softmax=False
    )
    assert len(scores) == 2
    for row in scores:
        assert len(row) == len(labels)
        assert all(isinstance(score, int | float) for score in row)


def test_causallm_large_batch(llama):
    """TestScoreAPIMultiArch.test_causallm_large_batch."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, ["A", "B", "C"])
    items = [f"Item {i}" for i in range(20)]
    scores = engine.score(query="Classify:", items=items, label_token_ids=labels)
    assert len(scores) == len(items)
    for row in scores:
        assert len(row) == len(labels)
        assert sum(row) == pytest.approx(1.0, abs=1e-4)


def test_consistency_across_architectures(architectures):
    """TestScoreAPIMultiArch.test_consistency_across_architectures: the instruct and the base
    Llama both give probability rows of the same shape (the base model's label ids are the
    instruct tokenizer's in SGLang's test; here each model's own, as their vocabularies
    differ)."""
    rows = []
    for name in ("causallm_llama", "causallm_llama_base"):
        engine, _ = architectures[name]
        labels = token_ids(engine.tokenizer, ["Yes", "No"])
        rows.append(
            engine.score(query="The answer is", items=["Yes", "No"], label_token_ids=labels)
        )
    instruct, base = rows
    assert len(instruct) == len(base)
    assert len(instruct[0]) == len(base[0])
    for row in [*instruct, *base]:
        assert sum(row) == pytest.approx(1.0, abs=1e-4)


def test_invalid_label_token_ids(llama):
    """TestScoreAPIMultiArch.test_invalid_label_token_ids: ids past the vocabulary raise."""
    engine, reference = llama
    vocab_size = reference.tokenizer.vocab_size
    with pytest.raises((ValueError, IndexError)):
        engine.score(query="Test", items=["Item"], label_token_ids=[vocab_size + 1, vocab_size + 2])


def test_empty_query(llama):
    """TestScoreAPIMultiArch.test_empty_query."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, ["Item"])
    scores = engine.score(query="", items=["Item"], label_token_ids=labels)
    assert len(scores) == 1
    assert len(scores[0]) == len(labels)


def test_single_item(llama):
    """TestScoreAPIMultiArch.test_single_item."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, ["Paris", "London"])
    scores = engine.score(query="The capital is", items=["Paris"], label_token_ids=labels)
    assert len(scores) == 1
    assert len(scores[0]) == len(labels)
    assert sum(scores[0]) == pytest.approx(1.0, abs=1e-4)


def test_single_label_token(llama):
    """TestScoreAPIMultiArch.test_single_label_token: one label, normalised, is 1."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, ["Yes"])
    scores = engine.score(query="The answer is", items=["Yes", "No"], label_token_ids=labels)
    assert len(scores) == 2
    for row in scores:
        assert len(row) == 1
        assert row[0] == pytest.approx(1.0, abs=1e-4)


def test_many_label_tokens(llama):
    """TestScoreAPIMultiArch.test_many_label_tokens."""
    engine, _ = llama
    labels = token_ids(engine.tokenizer, list("ABCDEFGH"))
    scores = engine.score(query="Choose:", items=["A", "B"], label_token_ids=labels)
    assert len(scores) == 2
    for row in scores:
        assert len(row) == len(labels)
        assert sum(row) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    "name",
    ["causallm_llama", "causallm_llama_base", "causallm_qwen", "sequence_classification_qwen3"],
)
def test_architecture(architectures, name):
    """TestScoreAPIMultiArch.test_architecture_<name> (SGLang adds one per TEST_MODELS entry)."""
    if name not in architectures:
        pytest.skip(
            "needs the trained Qwen3-Reranker-0.6B (Qwen3ForSequenceClassification), a hub "
            "checkpoint that cannot be installed here"
        )
    engine, _ = architectures[name]
    labels = token_ids(engine.tokenizer, ["Paris", "London"])
    scores = engine.score(
        query="The capital of France is", items=["Paris", "London"], label_token_ids=labels
    )
    assert len(scores) == 2
    for row in scores:
        assert len(row) == len(labels)
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
