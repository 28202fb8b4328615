"""Continuation log-probabilities on the real engine (tiny random Llama, float32):
Engine.continuation_logprobs and a DSL likelihood ranker against a transformers forward
(1e-4), one prompt per item (never a request per continuation token), the query kept in
the prefix cache, and bad calls refused without harming the engine."""

from __future__ import annotations

import pytest
from conftest import max_abs_diff

import prefillonly_sgl as prefillonly
from prefillonly_sgl.scoring.errors import InvalidRequestError

TOLERANCE = 1e-4  # float32 both sides
QUERY = "Rank these passages for a question about the moon and its landings, please.\n"
ITEMS = ["Passage: the moon landing\nQuestion:", "Passage: socks\nQuestion:",
         "Passage: a space opera\nQuestion:"]  # fmt: skip
CONTINUATION = " who walked on the moon?"


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


def tokens(reference, query, items, continuation) -> int:
    n_cont = len(reference.tokenizer.encode(continuation, add_special_tokens=False))
    return sum(len(reference.prompt_ids(query, item)) + n_cont for item in items)


def test_continuation_logprobs_equal_transformers(engine, reference):
    result = engine.continuation_logprobs(QUERY, ITEMS, CONTINUATION)
    want = reference.continuation_logprobs(QUERY, ITEMS, CONTINUATION)
    assert max_abs_diff(result.token_logprobs, want) < TOLERANCE
    assert result.means == pytest.approx([sum(r) / len(r) for r in want], abs=TOLERANCE)
    # One prompt per item: SGLang reports exactly the prompts' and continuations' tokens.
    assert result.prompt_tokens == tokens(reference, QUERY, ITEMS, CONTINUATION)
    # Token ids and one continuation per item.
    ids = reference.tokenizer.encode(QUERY)
    items = [reference.tokenizer.encode(i, add_special_tokens=False) for i in ITEMS[:2]]
    conts = [[5, 6, 7], [8]]
    got = engine.continuation_logprobs(ids, items, conts).token_logprobs
    assert [len(row) for row in got] == [3, 1]
    assert max_abs_diff(got, reference.continuation_logprobs(ids, items, conts)) < TOLERANCE


def test_the_query_is_computed_once_and_kept_in_the_prefix_cache(engine, reference):
    query = "Background for every passage: " + "the history of spaceflight. " * 8 + "\n"
    first = engine.continuation_logprobs(query, ITEMS, CONTINUATION)
    again = engine.continuation_logprobs(query, [i + " " for i in ITEMS], CONTINUATION)
    n_query = len(reference.tokenizer.encode(query))
    # The JCT scheduler computes the shared query once in the first call (one item
    # first, the others hit it), and the next call finds it for every item.
    assert first.cached_tokens >= (len(ITEMS) - 1) * (n_query - 2)
    assert again.cached_tokens >= len(ITEMS) * (n_query - 2)


def test_a_likelihood_ranker_ranks_by_the_mean_log_probability(engine, reference):
    @prefillonly.ranker(method="likelihood", item="passage")
    def passages(question: str, passage: str) -> prefillonly.Prompt:
        return prefillonly.Prompt(
            prefix=QUERY, item=f"Passage: {passage}\nQuestion:", continuation=f" {question}"
        )

    texts = ["the moon landing", "socks", "a space opera"]
    ranking = passages("who walked on the moon?", items=texts, engine=engine, top_k=2)
    want = reference.continuation_logprobs(QUERY, ITEMS, CONTINUATION)
    means = [sum(r) / len(r) for r in want]
    assert [r.score for r in ranking.by_input] == pytest.approx(means, abs=TOLERANCE)
    assert [r.index for r in ranking.items] == sorted(range(3), key=lambda i: -means[i])[:2]
    by_sum = passages("who walked on the moon?", items=texts, engine=engine, score="sum")
    assert [r.score for r in by_sum.by_input] == pytest.approx([sum(r) for r in want], abs=1e-3)


def test_bad_calls_are_refused_and_the_engine_keeps_answering(engine):
    with pytest.raises(InvalidRequestError, match="continuation is empty"):
        engine.continuation_logprobs(QUERY, ITEMS, "")
    with pytest.raises(InvalidRequestError, match="longer than"):
        engine.continuation_logprobs("word " * 5000, ITEMS, CONTINUATION)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        engine.continuation_logprobs([1, 2], [[3]], [10**6])
    assert len(engine.continuation_logprobs(QUERY, ITEMS[:1], CONTINUATION).token_logprobs) == 1
