"""Our OpenAI request models' extra fields and parse-time checks
(single_token/request_fields.py), the ids a single-token request reads and its answer
among allowed tokens (single_token/allowed_tokens.py): plain Python, no SGLang."""

from __future__ import annotations

import pytest

from prefillonly_sgl.single_token.allowed_tokens import logprob_ids, restricted_answer
from prefillonly_sgl.single_token.request_fields import (
    CompletionsFields,
    SingleTokenFields,
    check_max_tokens,
    check_response_format_object,
    check_zero_tokens_need_echo,
)


def test_the_extension_fields():
    assert list(SingleTokenFields.model_fields) == [
        "logprob_token_ids", "allowed_token_ids", "return_tokens_as_token_ids",
    ]  # fmt: skip
    assert list(CompletionsFields.model_fields)[-1] == "shared_prefix"
    assert CompletionsFields.model_validate({"shared_prefix": [1, 2]}).shared_prefix == [1, 2]


def test_response_format_must_be_an_object():
    check_response_format_object({"response_format": {"type": "json_schema"}})
    check_response_format_object({"response_format": None})
    check_response_format_object("not a dict: pydantic names it")
    with pytest.raises(ValueError, match="response_format must be an object"):
        check_response_format_object({"response_format": "json"})
    with pytest.raises(ValueError, match="response_format.schema must be an object"):
        check_response_format_object({"response_format": {"schema": "x"}})


def test_completions_max_tokens_zero_needs_echo():
    assert check_max_tokens(0) == 0 and check_max_tokens(None) is None
    with pytest.raises(ValueError, match="max_tokens must be 0 or more"):
        check_max_tokens(-1)
    check_zero_tokens_need_echo(0, True)
    check_zero_tokens_need_echo(1, False)
    with pytest.raises(ValueError, match="give echo: true"):
        check_zero_tokens_need_echo(0, False)


def test_the_ids_read_at_the_position():
    assert logprob_ids([5, 3], None) == [5, 3]
    assert logprob_ids(None, [3, 9]) == [3, 9]
    assert logprob_ids([5, 3], [3, 9, 5, 1]) == [5, 3, 9, 1]  # named first, each once
    assert logprob_ids(None, None) == []


def _decode(token: int, skip_special: bool) -> str:
    return f"<{token}{'' if skip_special else '!'}>"


GREEDY = {"temperature": 0.0, "stop_token_ids": [4]}
ROWS = [(-0.5, 2, "b"), (-1.0, 3, "c"), (-2.0, 4, "d")]


def test_the_answer_among_allowed_tokens():
    # SGLang's sampler took token 2, outside the allowed set: the best allowed one instead
    replaced = restricted_answer(ROWS, [3, 4], GREEDY, 0, (-0.5, 2, "b"), set(), _decode)
    assert replaced.row == (-1.0, 3, "c")
    assert replaced.finish == {"type": "length", "length": 1} and replaced.text == "<3>"
    # it already is the allowed one: SGLang's answer stands
    assert restricted_answer(ROWS, [2, 3], GREEDY, 0, (-0.5, 2, "b"), set(), _decode) is None
    # a stop token (the request's, or EOS unless ignore_eos) ends the answer: no text
    stop = restricted_answer(ROWS, [4], GREEDY, 0, (-0.5, 2, "b"), set(), _decode)
    assert stop.finish == {"type": "stop", "matched": 4} and stop.text == ""
    eos = restricted_answer(ROWS, [3], {"temperature": 0.0}, 0, None, {3}, _decode)
    assert eos.finish["type"] == "stop"
    kept = {"temperature": 0.0, "ignore_eos": True, "skip_special_tokens": False}
    shown = restricted_answer(ROWS, [3], kept, 0, None, {3}, _decode)
    assert shown.finish["type"] == "length" and shown.text == "<3!>"
    with pytest.raises(ValueError, match="no logprob for any allowed token"):
        restricted_answer(ROWS, [7], GREEDY, 0, None, set(), _decode)
