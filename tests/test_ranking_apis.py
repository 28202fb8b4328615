"""/v1/rerank and /v1/classify on a real `prefillonly serve` (tiny random Llama, float32):
results equal a plain transformers forward of the same prompts (1e-4), a Cohere-style
request works unchanged, the /v1/score path of the DSL agrees, and malformed requests
get a 400 naming the problem (never a 5xx)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import requests
from conftest import max_abs_diff

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt
from prefillonly_sgl.apis.ranking import classify_endpoint
from prefillonly_sgl.apis.rerank import Reranker
from prefillonly_sgl.apis.rerankers import qwen3_reranker
from prefillonly_sgl.dsl import RemoteBackend

APP = Path(__file__).with_name("ranking_app_example.py")
QUERY = "which film is about space?"
DOCUMENTS = ["a space opera", "a cooking show", "the moon landing", "socks"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server(apps_server):
    return apps_server  # conftest: this app and dsl_app_example.py, one per session


def reference_rows(reference, compiled) -> list[list[float]]:
    """A plain transformers forward of the prompts the DSL compiled, in input order."""
    return compiled.gather(
        [
            reference.score_sequences(r.query, list(r.items), list(r.label_token_ids))
            for r in compiled.requests
        ]
    )


def test_rerank_with_the_builtin_reranker_equals_transformers(server, reference):
    body = {"query": QUERY, "documents": DOCUMENTS, "return_documents": True}
    answer = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()
    results = answer["results"]
    assert sorted(r["index"] for r in results) == list(range(4))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)  # best first
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)
    want = reference_rows(
        reference, qwen3_reranker.compile(reference.tokenizer, QUERY, items=DOCUMENTS)
    )
    got = sorted(results, key=lambda r: r["index"])
    assert max(abs(g["relevance_score"] - w[0]) for g, w in zip(got, want)) < TOLERANCE
    assert answer["usage"]["prompt_tokens"] > 0 and answer["usage"]["cached_tokens"] > 0
    # The DSL through the same server's /v1/score gives the same scores.
    remote = RemoteBackend(server.url, tokenizer=reference.tokenizer, typed_endpoints=False)
    ranking = qwen3_reranker(QUERY, items=DOCUMENTS, engine=remote)
    assert max(abs(g["relevance_score"] - r.score) for g, r in zip(got, ranking.by_input)) < 1e-5


@prefillonly.classifier(labels=["Yes", "history books", "No thanks"])
def verdict(profile: str, item: str) -> Prompt:
    return Prompt(prefix=profile, item=f"Item: {item}\nVerdict:")


def test_labels_of_several_tokens_through_the_dsl_remote_backend(server, reference):
    """A classifier whose labels are several tokens, over prefillonly serve's
    /v1/score_labels (the DSL's remote path for them), equals the chain-rule reference."""
    remote = RemoteBackend(server.url, tokenizer=reference.tokenizer, typed_endpoints=False)
    inputs = [("Likes space films.\n", d) for d in DOCUMENTS]
    results = verdict.batch(inputs, engine=remote, progress=False)
    compiled = verdict.compile_batch(reference.tokenizer, inputs)
    assert any(isinstance(x, tuple) for x in compiled.requests[0].label_token_ids)
    want = compiled.gather(
        [
            reference.score_sequences(r.query, list(r.items), list(r.label_token_ids))
            for r in compiled.requests
        ]
    )
    got = [[r.probs[label] for label in ("Yes", "history books", "No thanks")] for r in results]
    assert max_abs_diff(got, want) < TOLERANCE


def test_a_cohere_style_request_works_unchanged(server):
    body = {  # what Cohere's client sends, provider-specific fields included
        "model": "rerank-v3.5",
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 2,
        "rank_fields": ["text"],
        "max_tokens_per_doc": 4096,
    }
    response = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert len(answer["results"]) == 2 and answer["model"] == "rerank-v3.5"
    assert "document" not in answer["results"][0] or answer["results"][0]["document"] is None
    with_instruction = {**body, "instruct": "Find films set in space"}
    assert requests.post(f"{server.url}/v1/rerank", json=with_instruction).status_code == 200


def test_classify_equals_transformers(server, reference):
    from ranking_app_example import review_sentiment

    texts = ["it worked well", "terrible side effects"]
    answer = requests.post(f"{server.url}/v1/classify", json={"input": texts}).json()
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(d["num_classes"] == 2 for d in answer["data"])
    want = reference_rows(reference, review_sentiment.compile_batch(reference.tokenizer, texts))
    assert max_abs_diff([d["probs"] for d in answer["data"]], want) < TOLERANCE
    labels = ["positive", "very negative"]
    assert [d["label"] for d in answer["data"]] == [labels[w.index(max(w))] for w in want]
    one = requests.post(f"{server.url}/v1/classify", json={"input": texts[0]}).json()
    assert max_abs_diff([one["data"][0]["probs"]], want[:1]) < 1e-5
    assert answer["function"] == "review_sentiment" and answer["labels"] == labels


def test_classify_a_chat_with_an_image_on_a_text_model_is_a_400(server):
    """/v1/classify's image_url parts need a vision-language model (served in
    tests/test_images_server.py): refused before the image is fetched, naming its part."""
    parts = [{"type": "text", "text": "Review: ok"},
             {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/a.png"}}]  # fmt: skip
    body = {"messages": [{"role": "user", "content": parts}]}
    answer = requests.post(f"{server.url}/v1/classify", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    assert "messages[0].content[1]: images need a vision-language model" in answer.text
    assert requests.post(f"{server.url}/v1/classify", json={"input": "ok"}).status_code == 200


def test_a_request_carrying_rid_gets_sglangs_native_answer(server):
    """What SGLang's gateway sends (its RerankRequest always has "rid") and parses: a list
    of {score, document, index, meta_info}, best first, with the label probabilities."""
    cohere = requests.post(f"{server.url}/v1/rerank",
                           json={"query": QUERY, "documents": DOCUMENTS}).json()  # fmt: skip
    body = {"query": QUERY, "documents": DOCUMENTS, "model": "unknown",
            "return_documents": True, "rid": None, "user": None}  # fmt: skip
    native = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()
    assert isinstance(native, list) and len(native) == len(DOCUMENTS)
    assert [r["index"] for r in native] == [r["index"] for r in cohere["results"]]
    for n, c in zip(native, cohere["results"]):
        assert n["document"] == DOCUMENTS[n["index"]]
        assert abs(n["score"] - c["relevance_score"]) < 1e-6
        meta = n["meta_info"]
        assert meta["function"] == "qwen3_reranker" and meta["labels"] == ["yes", "no"]
        assert abs(meta["probs"][0] - n["score"]) < 1e-6 and meta["call_prompt_tokens"] > 0
    top = requests.post(f"{server.url}/v1/rerank", json={**body, "top_k": 1}).json()
    assert len(top) == 1 and top[0]["index"] == native[0]["index"]


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"query": "", "documents": DOCUMENTS}, "query"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 9}, "top_n"),
        ("/v1/rerank", {"query": "word " * 5000, "documents": DOCUMENTS}, "shorten the query"),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": ["word " * 5000]},
            "documents[0] is 15001 tokens; with the query and the ranker's prompt at most 3862 "
            "fit (shorten it, or cut it: max_tokens_per_doc)",
        ),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": ["a"], "max_tokens_per_doc": 0},
            "max_tokens_per_doc",
        ),
        ("/v2/rerank", {"query": QUERY, "documents": []}, "documents"),
        (
            "/v2/rerank",
            {"query": QUERY, "documents": ["a"], "relevant_spans": {"mode": "enabled"}},
            "relevant_spans is not supported",
        ),
        ("/rerank", {"query": QUERY, "texts": []}, "texts"),
        ("/rerank", {"query": QUERY, "texts": ["a"], "truncate_bogus": True}, "truncate_bogus"),
        ("/rerank", {"query": QUERY, "texts": ["word " * 5000]}, "cut it: truncate: true"),
        (
            "/rerank",
            {"query": QUERY, "texts": ["a"], "truncation_direction": "Up"},
            "truncation_direction",
        ),
        ("/v1/rerank", {"documents": DOCUMENTS}, "query"),
        (
            "/v1/rerank",
            {"query": QUERY, "documents": DOCUMENTS, "top_n": 1, "top_k": 1},
            "not both",
        ),  # fmt: skip
        ("/v1/classify", {"input": []}, "input is empty"),
        ("/v1/classify", {"input": 5}, "input"),
    ],
)
def test_malformed_requests_get_a_400_naming_the_problem(server, path, body, message):
    response = requests.post(f"{server.url}{path}", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert message in response.text


def test_declarations_that_cannot_serve_the_apis_are_refused_at_start():
    from ranking_app_example import needs_user, relevant, review_sentiment

    Reranker(relevant)  # query + document: fine
    with pytest.raises(ValueError, match="also requires \\['user'\\]"):
        Reranker(needs_user)
    with pytest.raises(ValueError, match="one input text"):
        classify_endpoint(relevant)
    classify_endpoint(review_sentiment)


def test_the_gateway_client_writes_and_reads_the_apis_wire_models():
    """No server: the DSL's gateway client sends the bodies it always sent, built from the
    replicas' request models, and rebuilds rows and usage from answers written with their
    response models (prefillonly_sgl/wire/ on both ends)."""
    from ranking_app_example import likely_answer, relevant, review_sentiment

    from prefillonly_sgl.dsl import gateway_client
    from prefillonly_sgl.wire.prefillonly import Usage
    from prefillonly_sgl.wire.sglang import (
        ClassifyData,
        ClassifyResponse,
        RerankMeta,
        SGLangRerankResult,
    )

    sent, counted = [], []

    def post(path, body, headers=None):
        sent.append((path, body))
        if path == "/v1/rerank":
            return [
                SGLangRerankResult(score=p, index=i, meta_info=RerankMeta(
                    function="relevant", labels=["Yes", "No"], call_prompt_tokens=7,
                    call_cached_tokens=3, probs=[p, 1 - p],
                )).model_dump(mode="json")
                for i, p in ((1, 0.75), (0, 0.25))
            ]  # fmt: skip
        return ClassifyResponse(
            id="classify-1", created=0, model="m", function="review_sentiment",
            labels=["positive", "very negative"], usage=Usage(prompt_tokens=5, cached_tokens=1),
            data=[ClassifyData(index=i, label="positive", probs=[0.5 + i / 8, 0.5 - i / 8],
                               num_classes=2) for i in reversed(range(len(body["input"])))],
        ).model_dump(mode="json")  # fmt: skip

    count = lambda prompt, cached: counted.append((prompt, cached))  # noqa: E731

    def rows(post, job):
        return asyncio.run(gateway_client.GatewayRoute(post, "m", count).rows(job, None, 4))

    rows_got = rows(post, relevant.job("q", items=["a", "b"]))
    assert rows_got == [[0.25, 0.75], [0.75, 0.25]]
    job = review_sentiment.batch_job(["good", "bad"])
    assert rows(post, job) == [[0.5, 0.5], [0.625, 0.375]]
    assert sent == [
        ("/v1/rerank", {"query": "q", "documents": ["a", "b"], "rid": None}),
        ("/v1/classify", {"model": "m", "input": ["good", "bad"]}),
    ]
    assert counted == [(7, 3), (5, 1)]
    with pytest.raises(gateway_client.GatewayRouteError, match="no ClassifyResponse"):
        rows(lambda path, body: {"data": []}, job)

    # A likelihood ranker's rows are its continuations' token logprobs, read from meta_info.
    def likely_post(path, body, headers=None):
        return [
            SGLangRerankResult(score=-0.5, index=i, meta_info=RerankMeta(
                function="likely_answer", labels=[], call_prompt_tokens=9,
                call_cached_tokens=0, probs=[], method="likelihood", token_logprobs=row,
            )).model_dump(mode="json")
            for i, row in ((1, [-0.25, -0.75]), (0, [-2.0]))
        ]  # fmt: skip

    assert rows(likely_post, likely_answer.job("q", items=["a", "b"])) == [[-2.0], [-0.25, -0.75]]
    with pytest.raises(gateway_client.GatewayRouteError, match="by likelihood, not by labels"):
        rows(lambda path, body, headers=None: [
            {**r, "meta_info": {**r["meta_info"], "function": "relevant",
                                "labels": ["Yes", "No"]}}
            for r in likely_post(path, body)
        ], relevant.job("q", items=["a", "b"]))  # fmt: skip


def test_a_likelihood_ranker_on_every_route_equals_transformers(server, reference):
    """The same likelihood ranker through the server's typed endpoint, through SGLang's
    /generate (typed_endpoints=False: the route a stock SGLang server also answers) and
    the answers' token logprobs against a transformers forward."""
    from ranking_app_example import likely_answer

    compiled = likely_answer.compile(reference.tokenizer, QUERY, items=DOCUMENTS)
    want = compiled.gather(
        [reference.continuation_logprobs(r.query, list(r.items), list(r.continuations))
         for r in compiled.requests]
    )  # fmt: skip
    typed = RemoteBackend(server.url, tokenizer=reference.tokenizer)
    generate = RemoteBackend(server.url, tokenizer=reference.tokenizer, typed_endpoints=False)
    for backend in (typed, generate):
        ranking = likely_answer(QUERY, items=DOCUMENTS, engine=backend)
        got = [r.token_logprobs for r in ranking.by_input]
        assert max_abs_diff(got, want) < TOLERANCE, backend
        means = [sum(row) / len(row) for row in want]
        assert [r.index for r in ranking.items] == sorted(range(4), key=lambda i: -means[i])
    assert generate.prompt_tokens == sum(
        len(reference.prompt_ids(r.query, item))
        + len(reference.tokenizer.encode(c, add_special_tokens=False))
        for r in compiled.requests
        for item, c in zip(r.items, r.continuations)
    )  # fmt: skip  (one prompt per document: no request per query token)


def test_sglangs_native_rerank_answer_names_the_method(server):
    body = {"query": QUERY, "documents": DOCUMENTS[:2], "rid": None}
    native = requests.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()
    assert all(r["meta_info"]["method"] == "labels" for r in native)
    cohere = requests.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    meta = cohere.json()["meta"]
    assert meta["ranker"] == "qwen3_reranker" and meta["method"] == "judge"
    assert meta["api_version"] == {"version": "1"} and meta["tokens"]["input_tokens"] > 0
