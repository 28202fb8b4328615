"""Typed decisions in plain Python (no engine): the wording (SGLang's v1 reproduced
exactly, read from SGLang's own renderer), the plan (the state once as every request's
query, labels of several tokens, exclusive options), the answers' arithmetic, the three
wire shapes' refusals naming the field, and compressed bodies."""

from __future__ import annotations

import asyncio
import gzip
import json
import math

import pytest
import zstandard

from prefillonly_sgl.decisions import answers
from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.decisions.call import Message, Option, Question, QuestionResult
from prefillonly_sgl.decisions.plan import option_orders, plan_decision
from prefillonly_sgl.decisions.prompts import letter_code, question_block, render_state
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.body_encoding import DecodeRequestBody
from prefillonly_sgl.wire import openai as openai_wire
from prefillonly_sgl.wire import sglang as sglang_wire
from prefillonly_sgl.wire import systemone as systemone_wire

STATE = "Ticket: I was charged twice for my subscription. Please refund one payment."


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_path)


def openai_call(questions, **options):
    body = {"model": "m", "input": STATE, "questions": questions, **options}
    return openai_wire.to_call(parse(openai_wire.DecisionsRequest, body))


QUESTIONS = [
    {"type": "predicate", "instructions": "Is this about billing?", "name": "billing"},
    {"type": "predicate", "instructions": "Is the customer angry?"},
    {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "name": "team",
        "choices": [
            {"value": "billing", "description": "payments and refunds"},
            {"value": "technical support"},
            {"value": True},
        ],
    },
    {
        "type": "score",
        "instructions": "How urgent?",
        "levels": [{"label": "low"}, {"label": "high"}],
    },
]


# -- wording ---------------------------------------------------------------------------
def test_sglang_bodies_are_worded_as_sglang_words_them():
    from sglang.srt.entrypoints.openai.protocol import DecisionRequest
    from sglang.srt.entrypoints.openai.serving_decisions import (
        _decision_view,
        default_labels,
        render_question,
    )

    body = {
        "input": {"ticket": "charged twice"},
        "questions": [
            {"id": "c", "type": "choice", "question": "Team?",
             "options": [{"name": "billing", "description": "money"}, {"name": "tech"}]},
            {"id": "s", "type": "score", "question": "Urgency?", "levels": ["low", {"x": 1}]},
            {"id": "y", "type": "yes_no", "question": "Refund?", "yes": "a refund is asked"},
        ],
    }  # fmt: skip
    ours = sglang_wire.to_call(parse(sglang_wire.SGLangDecisionRequest, body))
    theirs = DecisionRequest.model_validate(body)
    text = sglang_wire.render_text(body["input"])
    assert ours.messages == (Message("user", text),)
    for question, their in zip(ours.questions, theirs.questions):
        view = _decision_view(their)
        order = tuple(range(len(question.options)))
        assert f"{text}\n\n{question_block(question, order, 'letters')}" == render_question(
            text=text, view=view, labels=default_labels(view)
        )
    assert [letter_code(k) for k in (0, 25, 26, 27, 51, 52)] == ["A", "Z", "AA", "AB", "AZ", "BA"]


def test_a_question_prompt_is_the_chat_template_around_the_state_and_the_question(tokenizer):
    call = openai_call(QUESTIONS)
    plan = plan_decision(call, tokenizer, 4096)
    for p in plan.prompts:
        question = call.questions[p.question]
        block = question_block(question, p.order, "names")
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{STATE}\n\n{block}"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert list(p.ids) == tokenizer.encode(text, add_special_tokens=False)


def test_a_model_without_a_chat_template_gets_the_plain_template(tokenizer):
    plain = render_state(
        _no_template(tokenizer), (Message("system", "Be brief."), Message("user", STATE)), {}
    )
    assert plain.prompt("Q?") == f"System: Be brief.\n\n{STATE}\n\nQ?\nAnswer:"
    assert not plain.chat and plain.add_special_tokens


class _no_template:
    def __init__(self, tokenizer):
        self._tok = tokenizer

    chat_template = None

    def __getattr__(self, name):
        return getattr(self._tok, name)


# -- the plan --------------------------------------------------------------------------
def test_every_question_is_an_item_behind_the_state_computed_once(tokenizer):
    plan = plan_decision(openai_call(QUESTIONS), tokenizer, 4096)
    assert len(plan.prompts) == len(QUESTIONS)
    queries = {tuple(g.query) for g in plan.groups}
    assert len(queries) == 1 and len(next(iter(queries))) == plan.state_tokens > 20
    predicates = [g for g in plan.groups if len(g.items) == 2]
    assert len(predicates) == 1, "the yes/no questions share one request"
    for g in plan.groups:
        for item, index in zip(g.items, g.prompts):
            assert g.query + item == list(plan.prompts[index].ids)


def test_options_of_several_tokens_and_an_option_inside_another(tokenizer):
    questions = [
        {"type": "choice", "instructions": "Reply?",
         "choices": [{"value": "yes"}, {"value": "yes please"}, {"value": "technical support"}]},
    ]  # fmt: skip
    plan = plan_decision(openai_call(questions), tokenizer, 4096)
    yes, yes_please, support = plan.prompts[0].labels
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert yes == (tokenizer.encode("yes", add_special_tokens=False)[0], end)
    assert len(yes_please) > 2 and yes_please[0] == yes[0] and end not in yes_please
    assert len(support) > 1 and end not in support


def test_debiasing_asks_other_orders_and_calibration_content_free_states(tokenizer):
    choice = Question("choice", "Q?", tuple(Option(v, v) for v in "abc"))
    assert option_orders(choice, "none") == [(0, 1, 2)]
    assert option_orders(choice, "reverse") == [(0, 1, 2), (2, 1, 0)]
    assert option_orders(choice, "cyclic") == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    score = Question("score", "Q?", tuple(Option(k, v) for k, v in enumerate("abc")))
    assert option_orders(score, "cyclic") == [(0, 1, 2)]

    plan = plan_decision(openai_call(QUESTIONS, debias="cyclic", calibrate=True), tokenizer, 4096)
    # 2 predicates + 3 orders of the choice + 1 score, each on the state and 3 priors
    assert len(plan.prompts) == (2 + 3 + 1) * 4
    assert len({tuple(g.query) for g in plan.groups}) == 4


def test_the_largest_requests_plan(tokenizer):
    many = [{"type": "predicate", "instructions": f"Is claim {i} true?"} for i in range(400)]
    assert len(plan_decision(openai_call(many), tokenizer, 100_000).prompts) == 400
    options = [{"value": f"option {i}"} for i in range(255)]
    wide = [{"type": "choice", "instructions": "Which?", "choices": options}]
    plan = plan_decision(openai_call(wide), tokenizer, 100_000)
    assert len(set(plan.prompts[0].labels)) == 255
    with pytest.raises(InvalidRequestError, match=r"questions\[0\]\.choices"):
        openai_call(
            [{"type": "choice", "instructions": "Which?", "choices": options + [{"value": "x"}]}]
        )
    with pytest.raises(InvalidRequestError, match="questions"):
        openai_call(many + many[:1])


def test_a_state_past_the_context_is_refused_and_a_question_past_it_answered_with_a_refusal(
    tokenizer,
):
    with pytest.raises(InvalidRequestError, match="input: the state is"):
        plan_decision(openai_call(QUESTIONS[:1]), tokenizer, 30)
    long_question = {"type": "predicate", "instructions": "Is it " + "very " * 200 + "urgent?"}
    plan = plan_decision(openai_call([QUESTIONS[0], long_question]), tokenizer, 200)
    assert set(plan.refusals) == {1} and "past the 200" in plan.refusals[1]


# -- answers ---------------------------------------------------------------------------
def test_confidence_is_the_published_formula():
    choice = Question("choice", "", tuple(Option(v, v) for v in "abcd"))
    assert answers.confidence(choice, [1, 0, 0, 0]) == 1
    assert answers.confidence(choice, [0.25] * 4) == 0
    assert math.isclose(answers.confidence(choice, [0.5, 0.5, 0, 0]), (0.5 - 0.25) / 0.75)
    score = Question("score", "", tuple(Option(k, str(k)) for k in range(3)))
    assert answers.confidence(score, [0, 1, 0]) == 1
    # mode 0; spread 0.5*1 + 0.5*2 = 1.5; typical mean |i-1| = 2/3 -> 1 - 2.25 < 0
    assert answers.confidence(score, [0.5, 0, 0.5]) == 0
    assert math.isclose(answers.confidence(score, [0.8, 0.2, 0]), 1 - 0.2 / (2 / 3))


def test_normalising_with_temperature():
    assert answers.normalise([0.2, 0.6]) == pytest.approx([0.25, 0.75])
    a, b = math.sqrt(0.2), math.sqrt(0.6)  # p ** (1 / T), renormalised
    assert answers.normalise([0.2, 0.6], temperature=2.0) == pytest.approx(
        [a / (a + b), b / (a + b)]
    )
    assert answers.normalise([0.0, 0.0]) == [0.5, 0.5]


def test_answers_average_orders_and_divide_out_the_prior(tokenizer):
    questions = [{"type": "choice", "instructions": "Which?",
                  "choices": [{"value": "a"}, {"value": "b"}]}]  # fmt: skip
    plan = plan_decision(openai_call(questions, debias="reverse", calibrate=True), tokenizer, 4096)
    raw = {}
    for i, p in enumerate(plan.prompts):
        if p.state == 0:
            raw[i] = [0.3, 0.1] if p.order == (0, 1) else [0.1, 0.1]  # 0.75 / 0.5
        else:
            raw[i] = [0.2, 0.2]  # a flat prior
    (result,) = answers.results(plan, raw)
    assert result.probabilities == pytest.approx((0.625, 0.375))
    assert result.label_mass == pytest.approx((0.4 + 0.2) / 2)
    assert isinstance(result, QuestionResult) and result.refusal is None


# -- wire shapes -------------------------------------------------------------------------
def _one(**question) -> dict:
    return {"questions": [question]}


def _choices(*values) -> dict:
    return _one(type="choice", instructions="a", choices=[{"value": v} for v in values])


IMAGE = {"type": "input_image", "image_url": "data:,"}
BAD_OPENAI = [
    ({"questions": []}, "questions: List should have at least 1"),
    (_one(type="predicate", instructions="  "), "questions[0].instructions: must not be empty"),
    (_one(type="bogus", instructions="a"), "questions[0]: Input tag 'bogus'"),
    (_one(type="predicate"), "questions[0].instructions: Field required"),
    (_choices("x", "X"), "questions[0].choices[1].value"),
    (_choices("true", True), "questions[0].choices[1].value"),
    (_choices(1, "b"), "questions[0].choices[0].value"),
    (_one(type="predicate", instructions="a", colour=1), "questions[0].colour"),
    (_one(type="predicate", instructions=[IMAGE]), "questions[0].instructions[0]: an image"),
    (
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "4"}]},
        "input[0].call_id",
    ),
    ({"debias": "sideways"}, "debias"),
    ({"min_label_mass": 2}, "min_label_mass"),
]


@pytest.mark.parametrize("change, message", BAD_OPENAI)
def test_bad_openai_bodies_are_refused_naming_the_field(change, message):
    body = {"model": "m", "input": STATE, "questions": QUESTIONS[:1], **change}
    with pytest.raises(InvalidRequestError) as e:
        openai_wire.to_call(parse(openai_wire.DecisionsRequest, body))
    assert message in str(e.value)


def test_tool_calls_and_outputs_are_part_of_the_state():
    body = {"model": "m", "questions": QUESTIONS[:1], "input": [
        {"role": "developer", "content": "Triage tickets."},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "paid twice"},
        {"role": "user", "content": [{"type": "input_text", "text": "Help"},
                                     {"type": "input_json", "data": {"order": 7}}]},
    ]}  # fmt: skip
    call = openai_wire.to_call(parse(openai_wire.DecisionsRequest, body))
    assert [m.role for m in call.messages] == ["system", "assistant", "user", "user"]
    assert call.messages[-1].content == 'Help\n{"order":7}'
    assert "lookup({})" in call.messages[1].content and "paid twice" in call.messages[2].content


def test_sglang_and_systemone_bodies_refuse_naming_the_field():
    sglang = {"input": "x", "questions": [{"id": "a", "type": "yes_no", "question": "q"}] * 2}
    with pytest.raises(InvalidRequestError, match="question id 'a' repeats"):
        parse(sglang_wire.SGLangDecisionRequest, sglang)
    with pytest.raises(InvalidRequestError, match="prompt_format_version"):
        parse(sglang_wire.SGLangDecisionRequest, {**sglang, "questions": sglang["questions"][:1],
                                                  "prompt_format_version": 2})  # fmt: skip
    box = {"model": "m", "state": "x", "questions": {"where": {"type": "box"}}}
    with pytest.raises(InvalidRequestError, match="questions.where: box questions"):
        systemone_wire.to_call(parse(systemone_wire.SystemOneRequest, box))
    calm_twice = {"type": "choice", "criteria": {"Calm": None, "calm ": None}}
    twice = {"model": "m", "state": "x", "questions": {"t": calm_twice}}
    with pytest.raises(InvalidRequestError, match="questions.t.criteria"):
        parse(systemone_wire.SystemOneRequest, twice)
    empty = {"model": "m", "state": "x", "questions": {"n": {"type": "noul"}}}
    with pytest.raises(InvalidRequestError, match="questions.n: .*noul question needs"):
        parse(systemone_wire.SystemOneRequest, empty)


def test_which_shape_a_decisions_body_is():
    assert not sglang_wire.is_sglang_body({"model": "m", "input": "x", "questions": QUESTIONS})
    assert sglang_wire.is_sglang_body({"input": "x", "questions": [{"id": "a", "type": "yes_no"}]})
    assert sglang_wire.is_sglang_body(
        {"input": "x", "questions": [{"type": "choice", "question": "?"}]}
    )
    assert sglang_wire.is_sglang_body({"input": "x", "questions": [], "temperature": 0.5})


# -- compressed bodies -------------------------------------------------------------------
def _post_through(middleware_args: dict, body: bytes, headers: list) -> tuple[int, bytes, dict]:
    seen = {}

    async def app(scope, receive, send):
        message = await receive()
        seen["body"], seen["headers"] = message["body"], dict(scope["headers"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    out = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        out.append(message)

    scope = {"type": "http", "path": "/v1/systemone", "headers": headers}
    asyncio.run(DecodeRequestBody(app, **middleware_args)(scope, receive, send))
    return out[0]["status"], out[1]["body"], seen


def test_zstd_and_gzip_bodies_reach_the_endpoint_decoded():
    data = json.dumps({"state": "x" * 5000}).encode()
    for encoding, packed in (("zstd", zstandard.compress(data)), ("gzip", gzip.compress(data))):
        status, _, seen = _post_through(
            {"max_request_bytes": 10_000},
            packed,
            [(b"content-encoding", encoding.encode()), (b"content-length", b"1")],
        )
        assert status == 200 and seen["body"] == data
        assert b"content-encoding" not in seen["headers"]
        assert seen["headers"][b"content-length"] == str(len(data)).encode()


def test_bad_compressed_bodies_get_errors_naming_the_problem():
    shapes = {"max_request_bytes": 10_000, "error_shapes": {"/v1/systemone": "openai"}}
    zstd = [(b"content-encoding", b"zstd")]
    status, body, _ = _post_through(shapes, b"not zstd at all", zstd)
    assert status == 400 and "not valid zstd" in json.loads(body)["error"]["message"]
    status, body, _ = _post_through(shapes, zstandard.compress(b"x" * 50_000), zstd)
    assert status == 413 and "decoded" in json.loads(body)["error"]["message"]
    status, body, _ = _post_through(shapes, b"{}", [(b"content-encoding", b"br")])
    assert status == 415 and "br" in json.loads(body)["error"]["message"]
