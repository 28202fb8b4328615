"""The plain decisions behind vLLM's conventions on shared paths
(prefillonly_sgl/wire/vllm.py; docs/server.md, "Peer conventions on one
path"), without a server. Not ported from vLLM: ours."""

from __future__ import annotations

import math

import pytest

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire.vllm import (
    echoes_documents,
    is_vllm_score_body,
    relevance_logit,
    score_fields,
    score_pairs,
    truncated,
    truncation_limit,
)


def test_a_rerank_result_echoes_its_document_unless_cohere_says_not_to():
    assert echoes_documents(None, {"query", "documents"})  # vLLM's body: echoed
    assert echoes_documents(True, {"rank_fields"})
    assert not echoes_documents(False, set())
    assert not echoes_documents(None, {"query", "documents", "rank_fields"})
    assert not echoes_documents(None, {"max_chunks_per_doc"})


@pytest.mark.parametrize(
    "body,vllm",
    [
        ({"queries": "q", "documents": ["d"]}, True),
        ({"text_1": ["a"], "text_2": ["b"]}, True),
        ({"data_1": "a", "data_2": "b"}, True),
        ({"queries": ["a"], "items": ["b"]}, True),
        ({"documents": ["d"]}, True),  # vLLM's, missing its queries: its error says so
        ({"query": "q", "items": ["i"], "label_token_ids": [1]}, False),  # SGLang's
        ({"items": ["i"]}, False),  # `items` alone: SGLang's field
        ({"query": "q", "queries": "q", "documents": ["d"]}, False),  # SGLang's key wins
        ({"label_token_ids": [1], "text_1": "a", "text_2": "b"}, False),
        ([{"queries": "q"}], False),
    ],
)
def test_a_score_body_is_vllms_by_its_own_keys(body, vllm):
    assert is_vllm_score_body(body) is vllm


def test_score_fields_name_what_is_missing_or_mixed():
    assert score_fields({"queries": "q", "items": ["i"]}) == ("queries", "items")
    assert score_fields({"text_1": "a", "text_2": "b"}) == ("text_1", "text_2")
    with pytest.raises(InvalidRequestError, match="documents is missing"):
        score_fields({"queries": "q"})
    with pytest.raises(InvalidRequestError, match="text_1 is missing"):
        score_fields({"text_2": "b"})
    with pytest.raises(InvalidRequestError, match="not several"):
        score_fields({"queries": "q", "documents": ["d"], "items": ["i"]})


def test_score_pairs_one_against_each_or_in_order():
    assert score_pairs("q", ["a", "b"]) == [("q", "a"), ("q", "b")]
    assert score_pairs(["q"], "a") == [("q", "a")]
    assert score_pairs(["q", "r"], ["a", "b"]) == [("q", "a"), ("r", "b")]
    with pytest.raises(InvalidRequestError, match="queries has 3 texts and documents 2"):
        score_pairs(["a", "b", "c"], ["d", "e"])
    with pytest.raises(InvalidRequestError, match="text_2 is empty"):
        score_pairs("a", [], ("text_1", "text_2"))
    with pytest.raises(InvalidRequestError, match="documents must be a text or a list"):
        score_pairs("a", None)


def test_truncation_keeps_the_first_tokens_unless_left():
    assert truncation_limit(None, 100) is None
    assert truncation_limit(-1, 100) == 100
    assert truncation_limit(5, 100) == 5
    with pytest.raises(InvalidRequestError, match="truncate_prompt_tokens is 101"):
        truncation_limit(101, 100)
    with pytest.raises(InvalidRequestError, match="truncate_prompt_tokens"):
        truncation_limit(0, 100)
    assert truncated([1, 2, 3, 4], 2) == [1, 2]
    assert truncated([1, 2, 3, 4], 2, "left") == [3, 4]
    assert truncated([1, 2], None) == [1, 2]


def test_relevance_logit_is_the_sigmoids_inverse_and_finite():
    for r in (0.1, 0.5, 0.93):
        assert 1 / (1 + math.exp(-relevance_logit(r))) == pytest.approx(r)
    assert math.isfinite(relevance_logit(0.0)) and math.isfinite(relevance_logit(1.0))
