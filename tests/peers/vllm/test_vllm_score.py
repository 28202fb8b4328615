"""vLLM's score tests, ported: vllm-project/vllm
tests/entrypoints/pooling/scoring/test_cross_encoder_online.py (its /score tests) and
tests/entrypoints/pooling/scoring/test_qwen3_reranker_online.py (score and rerank agree),
Apache-2.0, with their assertions kept, on /v1/score in vLLM's shapes (`queries` /
`documents` or `items`, `text_1` / `text_2`, `data_1` / `data_2`), which the server
answers beside SGLang's own /v1/score body (docs/server.md, "Peer conventions on one
path").

Adaptations (each also said where it applies):
- the model and server: vLLM starts BAAI/bge-reranker-base (a trained cross-encoder) or
  Qwen3-Reranker-0.6B; here the session's `default_server` (SmolLM2-135M-Instruct), whose
  pairs are scored by its reranker (query likelihood, apis/rerankers.py);
- vLLM's reference (sentence-transformers' CrossEncoder.predict on the checkpoint, rel
  0.01) becomes a plain transformers forward of the same prompts, at the same tolerance;
- the context: vLLM's is 100 tokens, ours 8192: over-long inputs are made longer;
- error wording: ours names the field (vLLM: "Please reduce the length of the input").
vLLM's ScoreResponse / RerankResponse are restated in vllm_response_models.py.
"""

from __future__ import annotations

import pytest
import requests
from vllm_reference import reference_relevance
from vllm_response_models import RerankResponse, ScoreResponse

pytestmark = pytest.mark.slow  # the default model's server

MODEL_NAME = "default"  # vLLM: "BAAI/bge-reranker-base"
TEXTS_1 = ["What is the capital of France?", "What is the capital of Germany?"]
TEXTS_2 = ["The capital of France is Paris.", "The capital of Germany is Berlin."]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server  # the session's default-model server (tests/conftest.py)


@pytest.fixture(scope="module")
def hf_model(default_reference):
    """In place of vLLM's hf_runner(..., is_cross_encoder=True): predict(pairs) by a
    transformers forward of the reranker's prompts."""

    known: dict[tuple[str, str], float] = {}  # one forward per pair for the module

    class Reference:
        @staticmethod
        def predict(pairs):
            for q, d in pairs:
                if (q, d) not in known:
                    known[(q, d)] = reference_relevance(default_reference, q, [d])[0]
            return [known[(q, d)] for q, d in pairs]

    return Reference()


def score(server, body):
    response = requests.post(f"{server.url}/v1/score", json={"model": MODEL_NAME, **body},
                             timeout=120)  # fmt: skip
    response.raise_for_status()
    return ScoreResponse.model_validate(response.json())


def assert_matches(score_response, hf_model, text_pairs):
    assert score_response.id is not None
    assert score_response.data is not None
    assert len(score_response.data) == len(text_pairs)
    vllm_outputs = [d.score for d in score_response.data]
    hf_outputs = hf_model.predict(text_pairs)
    for i in range(len(vllm_outputs)):
        assert hf_outputs[i] == pytest.approx(vllm_outputs[i], rel=0.01)


def test_score_api_queries_str_1_documents_str_1(server, hf_model):
    """test_score_api_queries_str_1_documents_str_1."""
    answer = score(server, {"queries": TEXTS_1[0], "documents": TEXTS_2[0]})
    assert_matches(answer, hf_model, [[TEXTS_1[0], TEXTS_2[0]]])


def test_score_api_queries_str_1_documents_str_n(server, hf_model):
    """test_score_api_queries_str_1_documents_str_n: one query against each document."""
    answer = score(server, {"queries": TEXTS_1[0], "documents": TEXTS_2})
    assert_matches(answer, hf_model, [[TEXTS_1[0], TEXTS_2[0]], [TEXTS_1[0], TEXTS_2[1]]])


@pytest.mark.parametrize(
    "first,second",
    [("queries", "documents"), ("queries", "items"), ("text_1", "text_2"), ("data_1", "data_2")],
)
def test_score_api_pairs_in_order(server, hf_model, first, second):
    """test_score_api_queries_str_n_documents_str_n, test_score_api_queries_vs_documents,
    test_score_api_queries_vs_items, test_score_api_text_1_vs_text_2 and
    test_score_api_data_1_vs_data_2 (the same pairs, each of vLLM's field names)."""
    answer = score(server, {first: TEXTS_1, second: TEXTS_2})
    assert_matches(answer, hf_model, [[TEXTS_1[0], TEXTS_2[0]], [TEXTS_1[1], TEXTS_2[1]]])


def test_score_api_max_model_len(server):
    """test_score_api_max_model_len. Adapted: the queries are made longer than our
    context (vLLM's is 100 tokens), and the truncation asked for is one token more than
    fits (vLLM: 101 for its 100); our messages name the field."""
    queries = "What is the capital of France?" * 1200
    documents = TEXTS_2
    body = {"model": MODEL_NAME, "queries": queries, "documents": documents}
    score_response = requests.post(f"{server.url}/v1/score", json=body)
    assert score_response.status_code == 400
    assert "shorten the query" in score_response.text  # vLLM: "Please reduce the length..."

    too_many = requests.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"] + 1
    score_response = requests.post(
        f"{server.url}/v1/score", json={**body, "truncate_prompt_tokens": too_many}
    )
    assert score_response.status_code == 400
    assert "request a smaller truncation size" in score_response.text
    assert "truncate_prompt_tokens" in score_response.text


def test_score_and_rerank_use_the_same_prompt(server):
    """test_qwen3_reranker_online.py::test_score_and_rerank_use_qwen3_reranker_template:
    /score and /rerank of one pair give the same score from the same prompt, the
    reranker's template around the pair (more tokens than the pair alone). Adapted: the
    template is our reranker's (query likelihood's), not Qwen3-Reranker's chat template;
    vLLM counts the templated tokens, here the pair alone is the lower bound."""
    query, document = TEXTS_1[0], TEXTS_2[0]
    score_response = score(server, {"queries": query, "documents": document})
    rerank_response = requests.post(f"{server.url}/rerank", json={
        "model": MODEL_NAME, "query": query, "documents": [document]})  # fmt: skip
    rerank_response.raise_for_status()
    rerank = RerankResponse.model_validate(rerank_response.json())

    info = requests.post(f"{server.url}/tokenize", json={"prompt": query + document}).json()
    assert score_response.usage.prompt_tokens == rerank.usage.prompt_tokens
    assert score_response.usage.prompt_tokens > info["count"]
    assert len(score_response.data) == 1
    assert len(rerank.results) == 1
    assert score_response.data[0].score == pytest.approx(rerank.results[0].relevance_score,
                                                         rel=0.01)  # fmt: skip


def test_sglangs_body_on_the_same_path_stays_sglangs(server):
    """Not a vLLM test: the other side of the collision on /v1/score: a body with
    SGLang's `query` / `items` / `label_token_ids` gets SGLang's answer (`scores`); a
    vLLM body that pairs badly gets a 400 naming its fields."""
    body = {"query": "Review: it worked.\nSentiment:", "items": [""],
            "label_token_ids": [2731, 3524], "apply_softmax": True}  # fmt: skip
    answer = requests.post(f"{server.url}/v1/score", json=body)
    assert answer.status_code == 200 and "scores" in answer.json()
    mixed = requests.post(f"{server.url}/v1/score", json={"queries": ["a", "b", "c"],
                                                           "documents": ["d", "e"]})  # fmt: skip
    assert mixed.status_code == 400 and "queries has 3 texts" in mixed.text
