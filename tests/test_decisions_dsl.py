"""The DSL speaks decisions both ways (tiny Llama, float32): a typed function whose
return model's fields are the questions runs on the local engine, on our server through
OpenAI's /v1/decisions and through System One's /v1/systemone, with the same answers
(1e-4); served by `serve --app`, it is a typed endpoint and a `model` of both decision
routes. And the routes' largest requests (400 questions, 255 options) answer 200."""

from __future__ import annotations

import dataclasses

import dsl_app_example as app
import pytest
import requests

import prefillonly_sgl as prefillonly
from prefillonly_sgl.decisions.call import Message
from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.scoring.errors import InvalidRequestError

TOLERANCE = 1e-4
TICKET = "I was charged twice for my plan and need a refund today."


@pytest.fixture(scope="module")
def server(apps_server):
    return apps_server  # conftest: serves tests/dsl_app_example.py (triage among them)


def close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < TOLERANCE for k in a)


def test_a_decision_function_answers_the_same_everywhere(tiny_engine, server):
    local = app.triage(TICKET, engine=tiny_engine)
    assert isinstance(local.value, app.Triage)
    assert set(local.answers) == {"billing", "team", "urgency"}
    assert set(local.answers["team"].probabilities) == {"billing", "technical support", "sales"}
    assert local.value.urgency in (0, 1, 2) and isinstance(local.value.billing, bool)
    openai_way = app.triage(TICKET, engine=server.url)  # OpenAI's /v1/decisions on our server
    for name, answer in local.answers.items():
        assert close(answer.probabilities, openai_way.answers[name].probabilities), name
    assert openai_way.value == local.value
    # System One's state is one text: the function's system and user messages are written
    # into it ("System: ...", blank line, the user's text), so it is a different prompt.
    system_one = prefillonly.DecisionServer(server.url, protocol="systemone")
    its_way = app.triage(TICKET, engine=system_one)
    call = app.triage.call(TICKET)
    flat = dataclasses.replace(call, messages=(Message("user", system_one.body(call)["state"]),))
    expected = app.triage.decided(
        tiny_engine.run_until_complete(tiny_engine.async_decide_call(flat)).results
    )
    assert flat.messages[0].content.startswith("System: You triage support tickets.\n\nTicket: ")
    for name, answer in expected.answers.items():
        assert close(answer.probabilities, its_way.answers[name].probabilities), name


def test_batch_keeps_input_order(tiny_engine):
    tickets = [TICKET, "The app crashes when I open settings.", "Do you sell team plans?"]
    results = app.triage.batch(tickets, engine=tiny_engine, progress=False)
    for ticket, result in zip(tickets, results):
        one = app.triage(ticket, engine=tiny_engine)
        assert close(result.answers["team"].probabilities, one.answers["team"].probabilities)


def test_served_as_a_typed_endpoint_and_by_name_on_both_routes(tiny_engine, server):
    local = app.triage(TICKET, engine=tiny_engine)
    typed = requests.post(f"{server.url}/decisions/triage", json={"ticket": TICKET}, timeout=60)
    assert typed.status_code == 200, typed.text
    body = typed.json()
    assert body["value"] == local.value.model_dump()
    assert close(body["probabilities"]["team"], local.answers["team"].probabilities)

    by_name = requests.post(
        f"{server.url}/v1/decisions", json={"model": "triage", "input": TICKET}, timeout=60
    ).json()
    assert [a["name"] for a in by_name["answers"]] == ["billing", "team", "urgency"]
    assert (
        abs(by_name["answers"][0]["probability"] - local.answers["billing"].probabilities[True])
        < TOLERANCE
    )
    system_one = requests.post(
        f"{server.url}/v1/systemone",
        json={"model": "triage", "state": {"ticket": TICKET}},
        timeout=60,
    ).json()
    assert system_one["answers"]["urgency"]["legend"] == {"0": "low", "1": "normal", "2": "urgent"}
    assert close(
        {int(k): p for k, p in system_one["answers"]["urgency"]["probabilities"].items()},
        local.answers["urgency"].probabilities,
    )


def test_declarations_that_cannot_be_questions_are_refused_at_decoration():
    from pydantic import BaseModel, Field

    class NoQuestion(BaseModel):
        urgent: bool

    with pytest.raises(DeclarationError, match="NoQuestion.urgent: give the question as Field"):
        prefillonly.decision(_returning(NoQuestion))

    class Free(BaseModel):
        note: str = Field(description="Anything to add?")

    with pytest.raises(DeclarationError, match="Free.note: a question is bool"):
        prefillonly.decision(_returning(Free))
    with pytest.raises(DeclarationError, match="annotated with a pydantic model"):
        prefillonly.decision(lambda ticket: ticket)
    with pytest.raises(InvalidRequestError, match="triage"):
        app.triage(ticket=3.5j, engine="http://127.0.0.1:9")  # invalid input, before any call


def _returning(model):
    def fn(ticket: str):
        return ticket

    fn.__annotations__ = {"ticket": str, "return": model}
    return fn


def test_the_largest_requests_answer_200(server):
    """Over HTTP: 400 questions, and one question of 255 options (names of several tokens)."""
    many = [{"type": "predicate", "instructions": f"Is claim {i} true?"} for i in range(400)]
    r = requests.post(f"{server.url}/v1/decisions", timeout=300,
                      json={"model": "m", "input": TICKET, "questions": many})  # fmt: skip
    assert r.status_code == 200, r.text
    assert len(r.json()["answers"]) == 400
    options = {f"option number {i}": None for i in range(255)}
    wide = {"model": "m", "state": TICKET,
            "questions": {"which": {"type": "choice", "criteria": options}}}  # fmt: skip
    r = requests.post(f"{server.url}/v1/systemone", json=wide, timeout=300)
    assert r.status_code == 200, r.text
    assert len(r.json()["answers"]["which"]["probabilities"]) == 255
