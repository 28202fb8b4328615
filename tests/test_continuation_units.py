"""Query likelihood's plain-Python parts, without SGLang: the continuation plan and its
checks, reading SGLang's input logprobs, the likelihood ranker's declaration and scores,
which built-in reranker a model gets, and per-document truncation (the tiny models'
tokenizer)."""

from __future__ import annotations

import math
import re

import pytest

import prefillonly_sgl as prefillonly
from prefillonly_sgl.apis.ranking import ranking_api_endpoints
from prefillonly_sgl.apis.rerankers import query_likelihood, rerank_method
from prefillonly_sgl.apis.truncation import cut, fit_documents
from prefillonly_sgl.dsl import DeclarationError
from prefillonly_sgl.dsl.request import ContinuationRequest
from prefillonly_sgl.scoring.continuations import (
    generate_fields,
    plan_continuations,
    token_logprobs_of,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.reusable_prefix import PREFIX_IDS_KEY
from prefillonly_sgl.scoring.validation import ModelLimits

LIMITS = ModelLimits(vocab_size=100, max_prompt_tokens=12)


def encode(text: str, special: bool) -> list[int]:
    """One token per character (ord % 90 + 10), BOS 1 with special tokens."""
    return ([1] if special else []) + [ord(c) % 90 + 10 for c in text]


def test_a_plan_puts_each_continuation_after_its_prompt_and_the_query_is_reusable():
    plan = plan_continuations("ab", ["c", "de"], " q", LIMITS, encode)
    assert plan.input_ids == [encode("abc", True) + encode(" q", False),
                              encode("abde", True) + encode(" q", False)]  # fmt: skip
    assert plan.starts == [4, 5] and plan.continuation_lengths() == [2, 2]
    assert plan.reusable == encode("ab", True)
    ids = plan_continuations([5, 6], [[7], [8, 9]], [[11], [12, 13]], LIMITS, encode)
    assert ids.input_ids == [[5, 6, 7, 11], [5, 6, 8, 9, 12, 13]] and ids.reusable == [5, 6]
    fields = generate_fields(plan)
    assert fields["logprob_start_len"] == [3, 4]  # the prompts' last positions
    assert fields["sampling_params"][0] == {
        "max_new_tokens": 0,
        "custom_params": {PREFIX_IDS_KEY: plan.reusable},
    }


@pytest.mark.parametrize(
    "query, items, continuation, message",
    [
        ("a", [], "q", "items is empty"),
        ("a", ["b"], "", "continuation is empty"),
        ("a", ["b", "c"], ["x"], "1 entries for 2 items"),
        ("a", ["b"], [[1, 2]], "all be text or all be token ids"),
        ("a", ["b" * 20], "q", "longer than the 12"),
        ([], [[]], [3], "the prompt (query + item) is empty"),
        ("a", ["b"], 7, "continuation must be a string"),
        ([1, 200], [[3]], [4], "outside the vocabulary"),
    ],
)
def test_bad_calls_are_refused_naming_the_problem(query, items, continuation, message):
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        plan_continuations(query, items, continuation, LIMITS, encode)


def test_sglangs_input_logprobs_are_read_after_the_prompts_last_position():
    entries = [(None, 5, None), (-0.5, 6, None), (-1.5, 7, None)]
    assert token_logprobs_of(entries, 2) == [-0.5, -1.5]
    with pytest.raises(RuntimeError, match="2 input logprobs for a continuation of 3"):
        token_logprobs_of(entries, 3)


def test_a_likelihood_ranker_declares_no_labels_and_scores_by_its_continuation():
    with pytest.raises(DeclarationError, match="takes no labels"):
        prefillonly.ranker(labels=["a", "b"], method="likelihood")(lambda q, item: "x")
    with pytest.raises(DeclarationError, match="method='votes'"):
        prefillonly.ranker(labels=["a"], method="votes")(lambda q, item: "x")
    rows = [[-1.0, -3.0], [-0.5, -0.5, -4.0]]
    ranking = query_likelihood.ranking(["d0", "d1"], rows)
    assert ranking.by_input[0].score == pytest.approx(-2.0)
    assert ranking.by_input[1].score == pytest.approx(-5.0 / 3)
    assert [r.index for r in ranking.items] == [1, 0]  # the better mean, not the better sum
    by_sum = query_likelihood.ranking(["d0", "d1"], rows, score="sum")
    assert [r.score for r in by_sum.by_input] == [-4.0, -5.0]
    assert ranking.by_input[1].token_logprobs == rows[1] and ranking.by_input[1].probs == {}
    with pytest.raises(InvalidRequestError, match="'mean', 'sum'"):
        query_likelihood.ranking(["d0"], rows[:1], score="yes")


def test_a_likelihood_ranker_compiles_to_continuation_requests(reference):
    compiled = query_likelihood.compile(reference.tokenizer, "capital?", items=["a", "b"])
    (request,) = compiled.requests
    assert isinstance(request, ContinuationRequest)
    assert request.query == "Please write a question based on this passage.\n"
    assert request.items == ("Passage: a\nQuestion:", "Passage: b\nQuestion:")
    assert request.continuations == (" capital?", " capital?")

    @prefillonly.classifier(labels=["yes", "no"])
    def with_continuation(text: str) -> prefillonly.Prompt:
        return prefillonly.Prompt(item=text, continuation=" yes")

    with pytest.raises(InvalidRequestError, match="only a likelihood ranker"):
        with_continuation.compile(reference.tokenizer, "x")


def test_the_builtin_reranker_follows_the_model_unless_asked():
    assert rerank_method("auto", "/models/Qwen3-Reranker-0.6B") == "judge"
    assert rerank_method("auto", "/root/.cache/SmolLM2-135M-Instruct") == "query-likelihood"
    assert rerank_method("auto", None) == "query-likelihood"
    assert rerank_method("judge", "/models/Llama-3-8B") == "judge"
    with pytest.raises(ValueError, match="expected one of"):
        rerank_method("bm25", "x")
    with pytest.raises(ValueError, match="a named ranker has its own method"):
        ranking_api_endpoints(["app.py"], "mine", None, "judge")
    summary = ranking_api_endpoints([], None, None, "auto", "Qwen3-Reranker-4B")[0].summary
    assert "qwen3_reranker" in summary


def test_documents_are_cut_at_a_token_boundary_by_the_stated_rule(reference):
    tok = reference.tokenizer
    text = "one two three four five six seven eight"
    n = len(tok.encode(text, add_special_tokens=False))
    assert n > 4
    head, tail = cut(tok, text, 4), cut(tok, text, 4, keep_end=True)
    assert text.startswith(head) and text.endswith(tail) and head != tail
    assert len(tok.encode(head, add_special_tokens=False)) == 4
    assert cut(tok, "short", 50) == "short"
    assert fit_documents(tok, [text, "short"], room=100, max_tokens_per_doc=4) == [head, "short"]
    with pytest.raises(InvalidRequestError, match=rf"texts\[1\] is {n} tokens; .* at most 3 fit"):
        fit_documents(tok, ["a", text], room=3, field="texts")
    assert fit_documents(tok, [text], room=4, truncate=True) == [head]
    with pytest.raises(InvalidRequestError, match="already fill the model's context"):
        fit_documents(tok, [text], room=0)


def test_likelihood_scores_are_means_per_token():
    assert math.isclose(query_likelihood.score_of([-1.0, -2.0, -3.0]), -2.0)
