"""Request validation, without SGLang: every bad input names the problem."""

from __future__ import annotations

import pytest

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.validation import ModelLimits, validate_score_request

LIMITS = ModelLimits(vocab_size=100, max_prompt_tokens=10)


def count_chars(query, item):  # a stand-in tokenizer: one token per character / id
    return len(query) + len(item)


def check(query, items, labels):
    return validate_score_request(query, items, labels, LIMITS, count_chars)


def test_valid_request_is_normalised():
    assert check("ab", "c", (1, 2)) == ("ab", ["c"], [(1,), (2,)])
    assert check(None, ["x", "yz"], [3]) == ("", ["x", "yz"], [(3,)])
    assert check([1, 2], [[3], [4, 5]], [9]) == ([1, 2], [[3], [4, 5]], [(9,)])
    # labels of several tokens: a list of ids per label, mixed with single ids
    assert check("ab", "c", [[4, 5], 6, (4,)]) == ("ab", ["c"], [(4, 5), (6,), (4,)])
    assert check("q", [], [1]) == ("q", [], [(1,)])  # no items, no rows: SGLang's answer


@pytest.mark.parametrize(
    "query, items, labels, message",
    [
        ("q", None, [1], "items must be a list"),
        ("q", ["a"], [], "label_token_ids is empty"),
        ("q", ["a"], None, "label_token_ids must be a list"),
        ("q", ["a"], [1, True], "must be integers"),
        ("q", ["a"], [100], "label_token_ids: Token ID 100 is out of vocabulary (vocab size: 100"),
        ("q", ["a"], [2, 3, 2, 3], "duplicates: [2, 3]"),
        ("q", ["a"], [[2, 3], 4, [2, 3]], "duplicates: [[2, 3]]"),
        ("q", ["a"], [[2, 3], []], "a non-empty list of them), got []"),
        ("q", ["a"], [[2, 1000]], "Token ID 1000 is out of vocabulary"),
        ("", [""], [1], "items[0]: the prompt (query + item) is empty"),
        ("q", ["a", "b" * 10], [1], "items[1]: the prompt (query + item) is 11 tokens"),
        ([], [[1, 200]], [1], "items[0] has token ids outside the vocabulary"),
        ([-1], [[1]], [1], "query has token ids outside the vocabulary"),
        ("q", [[1]], [1], "both be text or both be token ids"),
        ("q", [3.5], [1], "items[0] must be a string or a list of token ids"),
        (7, ["a"], [1], "query must be a string or a list of token ids"),
    ],
)
def test_bad_requests(query, items, labels, message):
    with pytest.raises(InvalidRequestError) as error:
        check(query, items, labels)
    assert message in str(error.value)


def test_invalid_request_error_is_a_value_error():
    """Callers catching SGLang's ValueError keep working."""
    with pytest.raises(ValueError):
        check("q", ["a"], [])


def test_score_prompts_have_their_own_limit_when_given():
    # Prefill-only KV: a score prompt is bounded by the context, other prompts by the pool.
    limits = ModelLimits(vocab_size=100, max_prompt_tokens=10, max_scoring_prompt_tokens=30)
    assert limits.scoring_prompt_tokens == 30 and LIMITS.scoring_prompt_tokens == 10
    validate_score_request("q" * 10, ["x" * 20], [1], limits, count_chars)
    with pytest.raises(InvalidRequestError, match="is 31 tokens, longer than the 30"):
        validate_score_request("q" * 10, ["x" * 21], [1], limits, count_chars)


def test_limits_come_from_the_schedulers_start_up_info():
    from prefillonly_sgl.features.prefill_kv.messages import SCORING_LIMIT_KEY as SCHEDULER_INFO_KEY
    from prefillonly_sgl.sglang_runtime.model_limits import limits_from_scheduler_info

    # SGLang refuses len >= max_req_input_len: the longest accepted prompt is one less.
    stock = limits_from_scheduler_info({"max_req_input_len": 1018}, vocab_size=100)
    assert (stock.max_prompt_tokens, stock.scoring_prompt_tokens) == (1017, 1017)
    ours = limits_from_scheduler_info(
        {"max_req_input_len": 1018, SCHEDULER_INFO_KEY: 4090}, vocab_size=100
    )
    assert (ours.max_prompt_tokens, ours.scoring_prompt_tokens) == (1017, 4089)
    assert ours.vocab_size == 100
