"""Choice requests' decisions without SGLang (prefillonly_sgl/choices/): which requests
qualify, the answer's shape, the greedy and sampled picks, the answer written part by
part (a scripted score function), its OpenAI rendering, and the guard's check."""

from __future__ import annotations

import asyncio
import json
import math
from enum import Enum

import pytest
from pydantic import BaseModel

from prefillonly_sgl.choices import selection
from prefillonly_sgl.choices.answering import answer, longest_answer_tokens
from prefillonly_sgl.choices.constraints import (
    fall_through_reasons,
    find_constraint,
    is_choice_request,
    scorable,
)
from prefillonly_sgl.choices.regex_literals import alternation_literals
from prefillonly_sgl.choices.rendering import chat_logprobs, completion_logprobs
from prefillonly_sgl.choices.shapes import Fixed, Slot, schema_shape
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.server.request_checks import check_completions_body


@pytest.mark.parametrize(
    "pattern, literals",
    [
        ("positive|negative", ["positive", "negative"]),
        ("^(yes|no)$", ["yes", "no"]),
        ("(?:A|B|C\\.)", ["A", "B", "C."]),
        ("mixed\\ feelings|none", ["mixed feelings", "none"]),
        ("single", ["single"]),
        ("a\\nb|c", ["a\nb", "c"]),
        ("[ab]|c", None),  # a class
        ("a+|b", None),  # a quantifier
        ("(a)|(b)", None),  # groups inside the alternatives
        ("a|", None),  # an empty alternative
        ("\\d|x", None),  # a class escape
        ("", None),
    ],
)
def test_alternation_literals(pattern, literals):
    assert alternation_literals(pattern) == literals


class Sentiment(str, Enum):
    positive = "positive"
    negative = "negative"


class Review(BaseModel):
    sentiment: Sentiment
    side_effects: bool


def test_pydantic_schema_is_fixed_text_around_a_slot_per_field():
    shape = schema_shape(Review.model_json_schema())  # $defs and $ref, as pydantic writes them
    assert shape.parts == (
        Fixed('{"sentiment":"'),
        Slot("sentiment", ("positive", "negative"), ("positive", "negative")),
        Fixed('","side_effects":'),
        Slot("side_effects", ("true", "false"), ("true", "false")),
        Fixed("}"),
    )


def test_schema_shapes_nested_consts_and_json_values():
    schema = {
        "type": "object",
        "properties": {
            "kind": {"const": "review"},
            "score": {"enum": [1, 2, None]},
            "inner": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
            },  # fmt: skip
        },
        "required": ["kind", "score", "inner"],
    }
    shape = schema_shape(schema)
    assert [p.text for p in shape.parts if isinstance(p, Fixed)] == [
        '{"kind":"review","score":',
        ',"inner":{"ok":',
        "}}",
    ]
    assert shape.slots[0] == Slot("score", ("1", "2", "null"), ("1", "2", "null"))
    assert shape.slots[1].name == "inner.ok"
    assert json.loads('{"kind":"review","score":2,"inner":{"ok":true}}')  # the written form


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "boolean"}}},  # optional: a choice
        {"type": "array", "items": {"type": "boolean"}},
        {"enum": ["", "x"]},  # nothing to score for ""
        {"properties": {"a": {"$ref": "#/$defs/Missing"}}, "required": ["a"]},
    ],
)
def test_schemas_outside_the_shape(schema):
    assert schema_shape(schema) is None


def test_each_form_of_constraint_and_its_sglang_fields():
    found = find_constraint({"structured_outputs": {"choice": ["a", "b.c"]}}, chat=True)
    assert found.shape.slots[0].texts == ("a", "b.c")
    assert found.sglang_fields == {"regex": "(a|b\\.c)"}
    found = find_constraint({"guided_json": json.dumps({"type": "string"})}, chat=True)
    assert found.shape is None
    assert found.sglang_fields["response_format"]["json_schema"]["schema"] == {"type": "string"}
    found = find_constraint({"guided_json": {"type": "string"}}, chat=False)
    assert found.sglang_fields == {"json_schema": '{"type": "string"}'}
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": Review.model_json_schema()}}
    found = find_constraint({"response_format": rf}, chat=True)
    assert found.source == "response_format" and found.sglang_fields == {}
    assert len(found.shape.slots) == 2
    assert find_constraint({"regex": "a|b"}, chat=False).shape is not None
    assert find_constraint({"regex": "a*"}, chat=False).shape is None
    assert find_constraint(
        {"structured_outputs": {"grammar": "root ::= x"}}, chat=True
    ).sglang_fields == {"ebnf": "root ::= x"}
    assert find_constraint({"response_format": {"type": "text"}}, chat=True) is None
    assert find_constraint({}, chat=True) is None


def test_refusals_and_fall_through_fields():
    with pytest.raises(InvalidRequestError, match="give one structured-output constraint, got 2"):
        find_constraint({"guided_choice": ["a"], "regex": "a|b"}, chat=True)
    with pytest.raises(InvalidRequestError, match="must be an object"):
        find_constraint({"structured_outputs": ["a"]}, chat=True)
    with pytest.raises(InvalidRequestError, match="is not valid JSON"):
        find_constraint({"json_schema": "{"}, chat=False)
    body = {"guided_choice": ["a", "b"], "logit_bias": {"5": 1}, "tools": [{"x": 1}],
            "tool_choice": "none", "stop": [], "frequency_penalty": 0.0}  # fmt: skip
    assert fall_through_reasons(body) == ["logit_bias"]  # tools with tool_choice none: unused
    assert not scorable(find_constraint(body, chat=True), body)
    assert is_choice_request(True, {"guided_choice": ["a", "b"]})
    assert not is_choice_request(True, {"guided_choice": ["a", "a"]})


def test_greedy_is_token_by_token_not_the_likeliest_sequence():
    choices = [(1, 2), (3, 4)]
    logprobs = [[-0.5, -3.0], [-1.0, -0.1]]  # the second is likelier as a whole
    assert selection.greedy_index(choices, logprobs) == 0
    assert selection.probabilities(selection.sequence_logprobs(logprobs))[1] > 0.9
    shared = [(1, 2), (1, 3), (4,)]
    assert selection.greedy_index(shared, [[-0.2, -2.0], [-0.2, -1.0], [-0.5]]) == 1
    steps = selection.steps(shared, [[-0.2, -2.0], [-0.2, -1.0], [-0.5]], 1)
    assert [s.token for s in steps] == [1, 3]
    assert steps[0].allowed == ((1, -0.2), (4, -0.5))
    assert steps[1].allowed == ((3, -1.0), (2, -2.0))


def test_terminators_only_where_a_choice_is_a_prefix_of_another():
    assert selection.terminated([(1,), (2, 3)], 9) == (((1,), (2, 3)), False)
    assert selection.terminated([(1,), (1, 3)], 9) == (((1, 9), (1, 3, 9)), True)


def test_sampling_is_seeded_and_respects_temperature():
    choices, logprobs = [(1,), (2,), (3,)], [[-0.1], [-3.0], [-5.0]]
    sampling = {"temperature": 1.0, "sampling_seed": 11}
    draws = [selection.pick(choices, logprobs, sampling, str(i)) for i in range(40)]
    assert draws == [selection.pick(choices, logprobs, sampling, str(i)) for i in range(40)]
    assert set(draws) <= {0, 1, 2} and draws.count(0) > 25
    assert selection.pick(choices, logprobs, {"temperature": 0.0}) == 0
    cold = {"temperature": 0.01, "sampling_seed": 3}
    assert all(selection.pick(choices, logprobs, cold, str(i)) == 0 for i in range(20))


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]  # one token per character


def _choice_tokens(texts, before):
    return [tuple(_encode(t)) for t in texts]


def test_answer_writes_fixed_text_and_scores_each_field_behind_it():
    shape = schema_shape(Review.model_json_schema())
    calls = []

    async def score(written, labels):
        calls.append(("".join(map(chr, written)), [bytes(x).decode() for x in labels]))
        # prefer the second choice of every slot
        return [[-2.0] * len(x) if i == 0 else [-0.5] * len(x) for i, x in enumerate(labels)]

    one = asyncio.run(answer(shape, "", score, _choice_tokens, _encode, 0, {"temperature": 0}))
    assert one.text == '{"sentiment":"negative","side_effects":false}'
    assert [c[0] for c in calls] == ['{"sentiment":"', '{"sentiment":"negative","side_effects":']
    assert "".join(chr(s.token) for s in one.steps) == one.text
    forced = [s for s in one.steps if s.logprob is None]
    assert "".join(chr(s.token) for s in forced) == '{"sentiment":"","side_effects":}'
    probs = one.choice_probabilities()
    assert set(probs) == {"sentiment", "side_effects"}
    # "true": 4 tokens at -2.0, "false": 5 at -0.5
    assert math.isclose(probs["side_effects"]["false"], 1 / (1 + math.exp(-8.0 + 2.5)))
    assert longest_answer_tokens(shape, _encode) == len(
        '{"sentiment":"negative","side_effects":false}'
    )


def test_a_terminator_scored_at_a_field_is_not_forced_again():
    shape = schema_shape({"enum": ["ab", "a"]})  # "a" is a prefix of "ab": '"' ends them

    async def score(written, labels):
        assert [bytes(x).decode() for x in labels] == ['ab"', 'a"']
        return [[-1.0, -1.0, -1.0], [-1.0, -0.1]]

    one = asyncio.run(answer(shape, "", score, _choice_tokens, _encode, 0, {"temperature": 0}))
    assert one.text == '"a"'
    assert [(chr(s.token), s.logprob) for s in one.steps] == [('"', None), ("a", -1.0), ('"', -0.1)]


def test_rendering_shapes():
    steps = [
        selection.Step(65, -0.5, ((65, -0.5), (66, -1.5))),
        selection.Step(67, None, ((67, 0.0),)),
    ]
    decode = chr
    chat = chat_logprobs(steps, 1, decode)
    assert chat["content"][0]["top_logprobs"] == [{"token": "A", "logprob": -0.5, "bytes": [65]}]
    assert chat["content"][1]["logprob"] == 0.0
    done = completion_logprobs(steps, 2, decode)
    assert done["tokens"] == ["A", "C"] and done["text_offset"] == [0, 1]
    assert done["top_logprobs"][0] == {"A": -0.5, "B": -1.5}


def test_guard_lets_shared_prefix_come_with_a_choice_request():
    limits = ModelLimits(vocab_size=100, max_prompt_tokens=64)
    body = {"prompt": ["ab1", "ab2"], "shared_prefix": "ab", "guided_choice": ["x", "y"]}
    assert check_completions_body(body, limits, 8) >= 1
    with pytest.raises(InvalidRequestError, match="applies to single-token requests"):
        check_completions_body({"prompt": "ab", "shared_prefix": "ab"}, limits, 8)
