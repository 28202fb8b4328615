"""Typed decisions on the tiny engine (float32, CPU): every answer equals a transformers
forward of the same prompts (options of several tokens, option orders and content-free
priors included) within 1e-4; the state is computed once per call and found cached by the
next call; the largest requests answer; bad input raises naming the field and leaves the
engine usable."""

from __future__ import annotations

import time

import pytest

from prefillonly_sgl.decisions import answers
from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire import openai as openai_wire

TOLERANCE = 1e-4
STATE = (
    "Ticket #4411 from a customer on the family plan: I was charged twice for my "
    "subscription this month and the app logs me out every hour. Please refund one payment."
)
QUESTIONS = [
    {"type": "predicate", "instructions": "Is this about billing?", "name": "billing"},
    {"type": "predicate", "instructions": "Is the customer angry?", "name": "angry"},
    {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "name": "team",
        "choices": [
            {"value": "billing", "description": "payments and refunds"},
            {"value": "technical support"},
            {"value": "yes"},
            {"value": "yes please"},
            {"value": True},
        ],
    },
    {
        "type": "score",
        "instructions": "How urgent is it?",
        "name": "urgency",
        "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high", "description": "now"}],
    },
]


def call_of(state: str, questions: list, **options):
    body = {"model": "m", "input": state, "questions": questions, **options}
    return openai_wire.to_call(parse(openai_wire.DecisionsRequest, body))


def decide(engine, call):
    return engine.run_until_complete(engine.async_decide_call(call))


def reference_results(reference, call, limit: int):
    """The same plan's prompts, each scored by a plain transformers forward (chain rule over
    each label's tokens), then the same arithmetic."""
    plan = plan_decision(call, reference.tokenizer, limit)
    raw = {
        i: reference.score_sequences(list(p.ids), [[]], [list(x) for x in p.labels], False)[0]
        for i, p in enumerate(plan.prompts)
    }
    return plan, answers.results(plan, raw)


@pytest.mark.parametrize("options", [{}, {"debias": "cyclic", "calibrate": True}])
def test_answers_equal_a_transformers_forward_of_the_same_prompts(tiny_engine, reference, options):
    call = call_of(STATE, QUESTIONS, **options)
    outcome = decide(tiny_engine, call)
    plan, expected = reference_results(reference, call, tiny_engine.limits.scoring_prompt_tokens)
    assert any(len(label) > 1 for p in plan.prompts for label in p.labels)
    for got, want in zip(outcome.results, expected, strict=True):
        assert got.refusal is None and got.prompt_token_ids == want.prompt_token_ids
        assert max(abs(a - b) for a, b in zip(got.probabilities, want.probabilities)) < TOLERANCE
        assert abs(got.label_mass - want.label_mass) < TOLERANCE
        assert abs(got.confidence - want.confidence) < 10 * TOLERANCE
        assert abs(sum(got.probabilities) - 1) < 1e-9


def test_the_state_is_computed_once_and_the_next_call_finds_it(tiny_engine):
    state = f"(ticket opened {time.time_ns()}) {STATE}"  # never seen by this engine
    questions = [{"type": "predicate", "instructions": f"Is claim {i} true?"} for i in range(8)]
    first = decide(tiny_engine, call_of(state, questions))
    plan = plan_decision(call_of(state, questions), tiny_engine.tokenizer, 10_000)
    k = plan.state_tokens
    own = sum(len(p.ids) - k for p in plan.prompts)  # the questions' own tokens
    computed = first.usage.input_tokens - first.usage.cached_tokens
    assert first.usage.prompts == 8
    assert own <= computed <= own + k  # the state at most once (its first tokens, the chat
    assert first.usage.cache_write_tokens > k - 10  # template's opening, were cached before)
    again = decide(tiny_engine, call_of(state, questions))
    assert again.usage.cache_write_tokens == 0
    assert again.usage.cached_tokens >= 8 * (k - 1)
    for a, b in zip(again.results, first.results, strict=True):
        assert a.probabilities == pytest.approx(b.probabilities, abs=TOLERANCE)


def test_engine_decide_returns_the_routes_answer(tiny_engine):
    decision = tiny_engine.decide(
        STATE, QUESTIONS[2:] + [{"type": "predicate", "instructions": "?"}]
    )
    assert isinstance(decision, openai_wire.Decision)
    body = decision.model_dump(mode="json")
    assert [a["type"] for a in body["answers"]] == ["choice", "score", "predicate"]
    assert [a["name"] for a in body["answers"]] == ["team", "urgency", None]
    assert body["answers"][0]["choice"] in [
        True,
        "billing",
        "technical support",
        "yes",
        "yes please",
    ]
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0


def test_400_questions_and_255_options_answer(tiny_engine):
    many = [{"type": "predicate", "instructions": f"Is claim {i} true?"} for i in range(400)]
    decision = tiny_engine.decide(STATE, many)
    assert len(decision.answers) == 400 and all(a.type == "predicate" for a in decision.answers)
    options = [{"value": f"option number {i}"} for i in range(255)]
    wide = tiny_engine.decide(
        STATE, [{"type": "choice", "instructions": "Which?", "choices": options}]
    )
    (answer,) = wide.answers
    assert len(answer.probabilities) == 255
    assert abs(sum(p.probability for p in answer.probabilities) - 1) < 1e-9


def test_bad_input_raises_naming_the_field_and_the_engine_stays_usable(tiny_engine):
    with pytest.raises(InvalidRequestError, match="input: the state is"):
        tiny_engine.decide("history " * 20_000, QUESTIONS[:1])
    with pytest.raises(InvalidRequestError, match=r"questions\[0\]\.choices\[1\]\.value"):
        tiny_engine.decide(STATE, [{"type": "choice", "instructions": "?",
                                    "choices": [{"value": "a"}, {"value": "a"}]}])  # fmt: skip
    assert len(tiny_engine.decide(STATE, QUESTIONS[:1]).answers) == 1
