"""Typed decisions through `prefillonly serve` on the default model (SmolLM2-135M-Instruct,
float32), with the real clients: openai 3.51's `client.decisions.create` (sync and async)
and typesafe-sdk's `TypeSafeClient.system_one` (zstd compression on, as its users get it);
SGLang's own /v1/decisions body answered in SGLang's shape; every probability equal to a
transformers forward of the same prompts within 1e-4 (options of several tokens
included); refusals in OpenAI's error shape naming the field."""

from __future__ import annotations

import asyncio
import time

import httpx2
import openai
import pytest
import requests
import typesafe_sdk
import zstandard
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient
from typesafe_sdk._core.compression import resolve_compression

from prefillonly_sgl.decisions import answers
from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.wire import openai as openai_wire

pytestmark = pytest.mark.slow  # the 135M default model's server

TOLERANCE = 1e-4
TICKET = (
    "Subject: charged twice\n\nHello, my card was charged twice for the annual plan "
    "(order 88231) and the app now says my subscription expired. I need one payment "
    "refunded and my access back today, this is the third time I write. Marta"
)
QUESTIONS = [
    {"type": "predicate", "instructions": "Is the ticket about billing?", "name": "billing"},
    {
        "type": "choice",
        "instructions": "Which team should handle the ticket?",
        "name": "team",
        "choices": [
            {"value": "billing", "description": "payments, refunds, invoices"},
            {"value": "technical support", "description": "bugs and access"},
            {"value": "sales"},
            {"value": False, "description": "no team: spam"},
        ],
    },
    {
        "type": "score",
        "instructions": "How urgent is the ticket?",
        "name": "urgency",
        "levels": [{"label": "low"}, {"label": "normal"}, {"label": "urgent"}],
    },
]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


def test_the_openai_client_gets_typed_answers_sync_and_async(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    decision = client.decisions.create(model="default", input=TICKET, questions=QUESTIONS)
    assert isinstance(decision, openai.types.Decision)
    billing, team, urgency = decision.answers
    assert (billing.type, billing.name, team.type, team.name) == (
        "predicate",
        "billing",
        "choice",
        "team",
    )
    assert 0 <= billing.probability <= 1
    assert team.choice in ("billing", "technical support", "sales", False)
    assert [p.value for p in team.probabilities] == ["billing", "technical support", "sales", False]
    assert urgency.type == "score" and [p.label for p in urgency.probabilities] == [
        "low",
        "normal",
        "urgent",
    ]
    assert 0 <= urgency.score <= 2 and 0 <= urgency.confidence <= 1
    usage = decision.usage
    assert (
        usage.input_tokens > 0
        and usage.output_tokens == 0
        and usage.total_tokens == usage.input_tokens
    )

    async def ask():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none") as aclient:
            return await aclient.decisions.create(
                model="default", input=TICKET, questions=QUESTIONS
            )

    again = asyncio.run(ask())
    assert [a.type for a in again.answers] == ["predicate", "choice", "score"]
    assert again.answers[0].probability == pytest.approx(billing.probability, abs=TOLERANCE)
    # the same state again: every prompt finds it in the prefix cache
    assert again.usage.input_tokens_details.cached_tokens > usage.input_tokens_details.cached_tokens
    assert again.usage.input_tokens_details.cache_write_tokens == 0


def test_every_probability_equals_a_transformers_forward(server, default_reference):
    decision = requests.post(
        f"{server.url}/v1/decisions",
        json={"model": "default", "input": TICKET, "questions": QUESTIONS},
        timeout=120,
    ).json()
    call = openai_wire.to_call(
        parse(openai_wire.DecisionsRequest, {"model": "m", "input": TICKET, "questions": QUESTIONS})
    )
    plan = plan_decision(call, default_reference.tokenizer, 8000)
    assert any(len(label) > 1 for p in plan.prompts for label in p.labels)  # "technical support"
    raw = {
        i: default_reference.score_sequences(list(p.ids), [[]], [list(x) for x in p.labels], False)[
            0
        ]
        for i, p in enumerate(plan.prompts)
    }
    expected = answers.results(plan, raw)
    for got, want in zip(decision["answers"], expected, strict=True):
        if got["type"] == "predicate":
            probabilities = [got["probability"]]
        else:
            probabilities = [p["probability"] for p in got["probabilities"]]
        assert max(abs(a - b) for a, b in zip(probabilities, want.probabilities)) < TOLERANCE
        assert abs(got["label_mass"] - want.label_mass) < TOLERANCE


def test_the_typesafe_client_with_zstd_compression(server):
    assert resolve_compression(None) == "zstd"  # typesafe-sdk[zstd]: every body >= 1 KiB
    sent = []
    http = httpx2.Client(
        event_hooks={"request": [lambda r: sent.append(r.headers.get("content-encoding"))]}
    )
    with TypeSafeClient(
        api_key="none", base_url=server.url, model="default", http_client=http
    ) as ts:
        (listed,) = ts.models.list().models
        assert listed.name and listed.release_date
        result = ts.system_one(
            state=TICKET * 3,  # over 1 KiB: compressed
            questions={
                "billing": Noul(instructions="Is the ticket about billing?"),
                "team": Choice(
                    instructions="Which team should handle the ticket?",
                    criteria={"billing": "payments", "technical support": None, "sales": None},
                ),
                "urgency": Score(
                    instructions="How urgent is it?", criteria=["low", "normal", "urgent"]
                ),
            },
        )
    assert "zstd" in sent
    assert isinstance(result, typesafe_sdk.SystemOneResponse)
    assert 0 <= result.nouls["billing"].noul <= 1
    assert result.choices["team"].choice in ("billing", "technical support", "sales")
    assert sum(result.choices["team"].probabilities.values()) == pytest.approx(1)
    assert result.scores["urgency"].legend == {0: "low", 1: "normal", 2: "urgent"}
    assert result.usage.input_tokens > 0


def test_sglangs_own_body_is_answered_in_its_shape_and_equals_transformers(
    server, default_reference
):
    body = {
        "input": TICKET,
        "questions": [
            {"id": "refund", "type": "yes_no", "question": "Does the customer ask for a refund?"},
            {"id": "team", "type": "choice", "question": "Which team?",
             "options": [{"name": "billing", "description": "money"}, {"name": "support"}]},
            {"id": "urgency", "type": "score", "question": "Urgency?", "levels": ["low", "high"]},
        ],
        "return_prompt_token_ids": True,
    }  # fmt: skip
    answer = requests.post(f"{server.url}/v1/decisions", json=body, timeout=120).json()
    assert answer["object"] == "decisions" and answer["prompt_format_version"] == 1
    assert set(answer["answers"]) == {"refund", "team", "urgency"}
    for one in answer["answers"].values():
        labels = [[x] if isinstance(x, int) else x for x in one["label_token_ids"]]
        want = default_reference.score_sequences(one["prompt_token_ids"], [[]], labels, False)[0]
        got = list(one["probabilities"].values())
        assert max(abs(a - b / sum(want)) for a, b in zip(got, want)) < TOLERANCE
        assert abs(one["label_mass"] - sum(want)) < TOLERANCE
    assert answer["answers"]["team"]["choice"] in ("billing", "support")
    assert "score" in answer["answers"]["urgency"]


def test_refusals_name_the_field_in_openais_error_shape(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.decisions.create(
            model="default",
            input=TICKET,
            questions=[
                {"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "A"}]}
            ],
        )
    assert "questions[0].choices[1].value" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="input: the state is"):
        client.decisions.create(model="default", input="history " * 9000, questions=QUESTIONS[:1])
    bad = requests.post(
        f"{server.url}/v1/systemone",
        data=b"\x28\xb5\x2f\xfd not really zstd",
        headers={"content-type": "application/json", "content-encoding": "zstd"},
        timeout=30,
    )
    assert bad.status_code == 400 and "not valid zstd" in bad.json()["error"]["message"]
    packed = zstandard.compress(b'{"model": "m", "state": "x", "questions": {}}')
    empty = requests.post(
        f"{server.url}/v1/systemone",
        data=packed,
        headers={"content-type": "application/json", "content-encoding": "zstd"},
        timeout=30,
    )
    assert empty.status_code == 400 and "questions" in empty.json()["error"]["message"]
    # and the server answers as before
    start = time.monotonic()
    assert client.decisions.create(model="default", input=TICKET, questions=QUESTIONS[:1]).answers
    assert time.monotonic() - start < 120
