"""Images through the rerank and decision doors of a real `prefillonly serve` on the tiny
Qwen2.5-VL (issue 86), its built-in yes/no judge as the reranker: the real cohere client
(v1: a Jina-style {"text", "image"} document and `image_data` for the query's image),
SGLang's content parts and vLLM's {"content": ...} on /v2/rerank, TEI's /rerank with our
`image_data` / `item_image_data`; /v1/decisions (OpenAI's input_image parts) and
/v1/systemone (`images`). Every probability within 1e-4 of transformers through the
model's own processor on the same prompt (verification/image_reference.py); the state's
image read from the prefix cache by a repeat; bad images 400s naming them, the server
alive after. The text-only refusals, which need no vision model, run on stand-ins of the
server's context (the same functions the doors call)."""

from __future__ import annotations

import asyncio
import base64
import math
import re
from types import SimpleNamespace

import pytest
import requests
from server_process import running_server
from test_images_engine import PLACEHOLDER, _png

from prefillonly_sgl.apis.rerankers import qwen3_reranker
from prefillonly_sgl.decisions.bodies import parse
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.decisions.state_images import with_placeholders
from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.verification.image_reference import ImageReference
from prefillonly_sgl.wire import openai as openai_wire
from prefillonly_sgl.wire import systemone as systemone_wire

pytestmark = pytest.mark.slow  # its own server (the tiny vision-language model)

TOLERANCE = 1e-4
QUERY = "Which photo shows a red shoe?"


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory):
    from transformers import AutoTokenizer

    path = build_family("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    log = tmp_path_factory.mktemp("vl-doors") / "serve.log"
    with running_server(path, log, "--rerank-method", "judge") as server:
        server.reference = ImageReference(path)
        server.tokenizer = AutoTokenizer.from_pretrained(path)  # the server's own
        yield server


def _relevance(server, query: str, document: str, images: list[bytes]) -> float:
    """transformers' P(yes) over yes/no after the judge's prompt of query and document
    (their texts holding a placeholder per image, as the rerank doors place them)."""
    prompt = qwen3_reranker.prompt(None, query=query, document=document)
    labels = qwen3_reranker.label_ids(server.tokenizer, prompt)
    return server.reference.label_probabilities(prompt.text, images, labels, True)[0]


def _alive(server) -> None:
    body = {"query": "q", "documents": ["a", "b"]}
    assert requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).status_code == 200


# -- rerank ------------------------------------------------------------------------------
def test_the_cohere_client_ranks_image_documents_behind_the_querys_image(vl_server):
    import cohere

    shoe, bag, photo = _png(71), _png(72), _png(73)
    client = cohere.Client(base_url=vl_server.url, api_key="none")
    answer = client.rerank(
        model="m",
        query=QUERY,
        documents=[
            {"text": "a photo", "image": _data_url(shoe)},
            {"text": "another photo", "image": _data_url(bag)},
            "a red shoe",
        ],
        return_documents=True,
        request_options={"additional_body_parameters": {"image_data": _data_url(photo)}},
    )
    got = {r.index: r.relevance_score for r in answer.results}
    q = PLACEHOLDER + QUERY
    want = {
        0: _relevance(vl_server, q, PLACEHOLDER + "a photo", [photo, shoe]),
        1: _relevance(vl_server, q, PLACEHOLDER + "another photo", [photo, bag]),
        2: _relevance(vl_server, q, "a red shoe", [photo]),
    }
    assert got == pytest.approx(want, abs=TOLERANCE)
    assert {r.index: r.document.text for r in answer.results}[0] == "a photo"  # text only


def test_sglang_vllm_and_tei_shapes_as_transformers(vl_server):
    photo, first, second = _png(81), _png(82), _png(83)
    query = [{"type": "image_url", "image_url": {"url": _data_url(photo)}},
             {"type": "text", "text": QUERY}]  # fmt: skip
    documents = [
        {"content": [{"type": "image_url", "image_url": {"url": _data_url(first)}}]},  # vLLM
        [
            {"type": "text", "text": "a shoe"},
            {"type": "image_url", "image_url": {"url": _data_url(second)}},
        ],  # SGLang  # fmt: skip
    ]
    body = {"query": query, "documents": documents}
    v2 = requests.post(f"{vl_server.url}/v2/rerank", json=body, timeout=120)
    assert v2.status_code == 200, v2.text
    got = {r["index"]: r["relevance_score"] for r in v2.json()["results"]}
    q = PLACEHOLDER + QUERY
    want = {
        0: _relevance(vl_server, q, PLACEHOLDER, [photo, first]),
        1: _relevance(vl_server, q, PLACEHOLDER + "a shoe", [photo, second]),
    }
    assert got == pytest.approx(want, abs=TOLERANCE)
    tei = {"query": QUERY, "texts": ["", "a shoe"], "image_data": _data_url(photo),
           "item_image_data": [[_data_url(first)], [_data_url(second)]]}  # fmt: skip
    ranks = requests.post(f"{vl_server.url}/rerank", json=tei, timeout=120)
    assert ranks.status_code == 200, ranks.text
    assert {r["index"]: r["score"] for r in ranks.json()} == pytest.approx(want, abs=TOLERANCE)


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            {"documents": [{"text": "a", "image": "data:image/png;base64,AAAA"}]},
            r"documents\[0\]\.image: not a decodable image",
        ),  # fmt: skip
        ({"image_data": "http://127.0.0.1:9/a.png"}, r"image_data\[0\]: cannot fetch"),
        ({"documents": [{"text": "a", "image": _data_url(_png(1))}] * 17}, "at most 16 images"),
        ({"image_data": "/etc/hostname"}, r"an http\(s\) URL or a data URL"),
    ],
)
def test_bad_rerank_images_are_400s_naming_them(vl_server, change, problem):
    body = {"query": QUERY, "documents": ["a"], **change}
    answer = requests.post(f"{vl_server.url}/v1/rerank", json=body, timeout=120)
    assert answer.status_code == 400 and re.search(problem, answer.text), answer.text
    _alive(vl_server)


# -- decisions ---------------------------------------------------------------------------
QUESTIONS = [
    {"type": "predicate", "instructions": "Is it red?", "name": "red"},
    {
        "type": "choice",
        "instructions": "What is it?",
        "name": "kind",
        # several tokens each in the tiny tokenizer ("shoe" is 4): read behind the
        # state's image by the chain rule
        "choices": [{"value": "shoe"}, {"value": "bag"}],
    },  # fmt: skip
]


def _want(server, call, images: list[bytes]) -> dict:
    """Per question (by name) transformers' option probabilities and their label mass, on
    the plan's own prompts (the state with its placeholders; an option of several tokens by
    the chain rule)."""
    call = with_placeholders(call, PLACEHOLDER)
    plan = plan_decision(call, server.tokenizer, 10_000, images)
    want = {}
    for group in plan.groups:
        for item, index in zip(group.items, group.prompts, strict=True):
            prompt, text = plan.prompts[index], group.query + item
            if all(len(label) == 1 for label in prompt.labels):
                ids = [label[0] for label in prompt.labels]
                raw = server.reference.label_probabilities(text, images, ids, False)
            else:  # the chain rule over each option's tokens
                logprobs = server.reference.sequence_logprobs(text, images, prompt.labels)
                raw = [math.exp(x) for x in logprobs]
            name = call.questions[prompt.question].name
            want[name] = ([p / sum(raw) for p in raw], sum(raw))
    return want


def test_decisions_and_systemone_read_the_states_image(vl_server):
    image = _png(91)
    state = [{"role": "user", "content": [
        {"type": "input_image", "image_url": _data_url(image)},
        {"type": "input_text", "text": "A product photo."}]}]  # fmt: skip
    body = {"model": "m", "input": state, "questions": QUESTIONS}
    want = _want(vl_server, openai_wire.to_call(parse(openai_wire.DecisionsRequest, body)), [image])
    cached = []
    for _ in range(2):  # the repeat reads the state, its image included, from the cache
        answer = requests.post(f"{vl_server.url}/v1/decisions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        red, kind = answer.json()["answers"]
        assert [red["probability"], red["label_mass"]] == pytest.approx(
            [want["red"][0][0], want["red"][1]], abs=TOLERANCE
        )
        got = [p["probability"] for p in kind["probabilities"]]
        assert got == pytest.approx(want["kind"][0], abs=TOLERANCE)
        cached.append(answer.json()["usage"]["input_tokens_details"]["cached_tokens"])
    assert cached[1] > cached[0] + 16  # the image's 16 tokens and more

    one = {"model": "m", "state": "A product photo.", "images": [_data_url(image)],
           "questions": {"red": {"type": "noul", "instructions": "Is it red?"}}}  # fmt: skip
    want = _want(vl_server, systemone_wire.to_call(parse(systemone_wire.SystemOneRequest, one)),
                 [image])  # fmt: skip
    answer = requests.post(f"{vl_server.url}/v1/systemone", json=one, timeout=120)
    assert answer.status_code == 200, answer.text
    red = answer.json()["answers"]["red"]
    assert [red["noul"], red["x_label_mass"]] == pytest.approx(
        [want["red"][0][0], want["red"][1]], abs=TOLERANCE
    )


@pytest.mark.parametrize(
    "path, body, problem",
    [
        (
            "/v1/decisions",
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
                        ],
                    }
                ]
            },
            r"input\[0\]\.content\[0\]: not a decodable image",
        ),  # fmt: skip
        (
            "/v1/systemone",
            {"state": "x", "images": ["http://127.0.0.1:9/a.png"]},
            r"images\[0\]: cannot fetch",
        ),  # fmt: skip
        (
            "/v1/systemone",
            {"state": "x", "images": [_data_url(_png(2))] * 17},
            "at most 16 images",
        ),  # fmt: skip
        (
            "/v1/systemone",
            {"state": "x", "questions": {"where": {"type": "box"}}},
            "questions.where: box questions",
        ),  # fmt: skip
        (
            "/v1/systemone",
            {"state": "x", "assets": {"p": {"type": "image"}}},
            "assets: System One's image assets",
        ),  # fmt: skip
    ],
)
def test_bad_decision_images_are_400s_naming_them(vl_server, path, body, problem):
    if path == "/v1/decisions":
        body = {"model": "m", "questions": QUESTIONS[:1], **body}
    else:
        body = {"model": "m", "questions": {"red": {"type": "noul", "instructions": "Red?"}},
                **body}  # fmt: skip
    answer = requests.post(f"{vl_server.url}{path}", json=body, timeout=120)
    assert answer.status_code == 400 and re.search(problem, answer.text), answer.text
    _alive(vl_server)


# -- a text-only model (no vision model needed) ------------------------------------------
def test_a_text_only_model_refuses_images_at_these_doors_before_fetching():
    """The doors' own checks on a context / front of a text-only model: refused naming
    the image, before its URL (unreachable here) is fetched."""
    from prefillonly_sgl.apis.rerank_images import load_rerank_images
    from prefillonly_sgl.sglang_runtime.decision_images import decide_with_images

    context = SimpleNamespace(image_placeholder=None, image_refusal=None)
    reranker = SimpleNamespace(method="judge", name="qwen3_reranker")
    unreachable = [("documents[0].image", "http://127.0.0.1:9/a.png")]
    with pytest.raises(InvalidRequestError, match=r"documents\[0\]\.image: images need"):
        asyncio.run(load_rerank_images(context, reranker, [], [unreachable]))
    front = SimpleNamespace(
        readout=SimpleNamespace(is_checkpoint=False),
        facts=SimpleNamespace(image_placeholder=None, image_refusal=None),
    )
    body = {"model": "m", "state": "x", "images": ["http://127.0.0.1:9/a.png"],
            "questions": {"red": {"type": "noul", "instructions": "Red?"}}}  # fmt: skip
    call = systemone_wire.to_call(parse(systemone_wire.SystemOneRequest, body))
    with pytest.raises(InvalidRequestError, match=r"images\[0\]: an image needs a vision"):
        asyncio.run(decide_with_images(front, None, call))


def test_a_likelihood_reranker_refuses_images_naming_the_judge():
    from prefillonly_sgl.apis.rerank_images import load_rerank_images

    context = SimpleNamespace(image_placeholder=object(), image_refusal=None)
    reranker = SimpleNamespace(method="likelihood", name="query_likelihood")
    with pytest.raises(InvalidRequestError, match="--rerank-method judge"):
        asyncio.run(load_rerank_images(context, reranker, [("image_data[0]", "x")], [[]]))
