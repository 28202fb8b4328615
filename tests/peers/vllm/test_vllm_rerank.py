"""vLLM's rerank tests, ported: vllm-project/vllm
tests/entrypoints/pooling/scoring/test_cross_encoder_online.py (its rerank tests; the same
tests as the older tests/entrypoints/pooling/score/test_online_rerank.py), Apache-2.0,
with their assertions kept, run on every path vLLM serves its rerank on and we serve in
its name: /rerank, /v1/rerank and /v2/rerank.

Adaptations (each also said where it applies):
- the model and server: vLLM starts BAAI/bge-reranker-base (a trained cross-encoder,
  --max-model-len 100); here the session's `default_server` (SmolLM2-135M-Instruct, whose
  default reranker is query likelihood, apis/rerankers.py), shared with the other modules;
- values only a trained cross-encoder gives (the relevant document >= 0.9, the other
  <= 0.01) become the relevant document first and the scores of an independent
  reference, a plain transformers forward of the same prompts (as tests/test_reranking.py);
- the context: vLLM's is 100 tokens, ours 8192: an over-long query is made longer;
- error wording: ours names the field (vLLM: "Please reduce the length of the input").
vLLM's response model (RerankResponse) is restated in vllm_response_models.py.
"""

from __future__ import annotations

import pytest
import requests
import torch
import torch.nn.functional as F
from vllm_reference import reference_relevance
from vllm_response_models import RerankResponse

pytestmark = pytest.mark.slow  # the default model's server

PATHS = ["/rerank", "/v1/rerank", "/v2/rerank"]  # vLLM serves one handler on all three
MODEL_NAME = "default"  # vLLM: "BAAI/bge-reranker-base"; ours echoes the request's model
QUERY = "What is the capital of France?"
DOCUMENTS = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server  # the session's default-model server (tests/conftest.py)


def post(server, path, body):
    return requests.post(f"{server.url}{path}", json=body, timeout=120)


@pytest.fixture(scope="module")
def want(default_reference) -> list[float]:
    """The reference's relevance of DOCUMENTS for QUERY (one forward for the module)."""
    return reference_relevance(default_reference, QUERY, DOCUMENTS)


def test_basic(server, default_reference):
    """test_basic: /v1/models lists the served model; /tokenize gives the model's tokens.
    Adapted: vLLM compares with bge-reranker-base's ids; here with our tokenizer's."""
    served_model = requests.get(f"{server.url}/v1/models").json()["data"][0]["id"]
    info = requests.get(f"{server.url}/get_model_info").json()
    assert served_model == info["model_path"]
    input_text = "This product was excellent and exceeded my expectations"
    response = post(server, "/tokenize", {"model": served_model, "prompt": input_text})
    assert response.json()["tokens"] == default_reference.tokenizer.encode(input_text)


@pytest.mark.parametrize("path", PATHS)
def test_rerank_api_texts(server, want, path):
    """test_rerank_api_texts."""
    rerank_response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                          "documents": DOCUMENTS})  # fmt: skip
    rerank_response.raise_for_status()
    rerank = RerankResponse.model_validate(rerank_response.json())

    assert rerank.id is not None
    assert rerank.results is not None
    assert len(rerank.results) == 2
    # vLLM: results[0] >= 0.9 and results[1] <= 0.01 (the trained cross-encoder's values).
    # Adapted: Paris first, each score the reference's, each document echoed.
    assert rerank.results[0].index == 1
    for result in rerank.results:
        assert result.relevance_score == pytest.approx(want[result.index], abs=1e-4)
        assert result.document.text == DOCUMENTS[result.index]


@pytest.mark.parametrize("path", PATHS)
def test_rerank_api_top_n(server, path):
    """test_rerank_api_top_n."""
    documents = [*DOCUMENTS, "Cross-encoder models are neat"]
    rerank_response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                          "documents": documents, "top_n": 2})  # fmt: skip
    rerank_response.raise_for_status()
    rerank = RerankResponse.model_validate(rerank_response.json())

    assert rerank.id is not None
    assert rerank.results is not None
    assert len(rerank.results) == 2
    # vLLM: >= 0.9 / <= 0.01 (trained values). Adapted: the relevant one first, best first.
    assert rerank.results[0].index == 1
    assert rerank.results[0].relevance_score >= rerank.results[1].relevance_score


@pytest.mark.parametrize("path", PATHS)
def test_rerank_api_max_model_len(server, path):
    """test_rerank_api_max_model_len. Adapted: the query is repeated past our 8192-token
    context (vLLM's is 100 tokens); the message names the query instead of vLLM's
    "Please reduce the length of the input prompt"."""
    query = QUERY * 1200
    rerank_response = post(server, path, {"model": MODEL_NAME, "query": query,
                                          "documents": DOCUMENTS})  # fmt: skip
    assert rerank_response.status_code == 400
    assert "shorten the query" in rerank_response.text


@pytest.mark.skip(reason="SageMaker's /invocations is SGLang's own route: it does not "
                  "dispatch to our rerank APIs")  # fmt: skip
def test_invocations():
    """test_invocations."""


@pytest.mark.parametrize("path", PATHS)
def test_use_activation(server, path):
    """test_use_activation: use_activation false gives the scores before vLLM's rerank
    activation (a sigmoid). Ours: log(r / (1 - r)) of each relevance r."""

    def get_outputs(use_activation):
        response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                       "documents": DOCUMENTS,
                                       "use_activation": use_activation})  # fmt: skip
        outputs = response.json()
        return torch.tensor([x["relevance_score"] for x in outputs["results"]])

    default = get_outputs(use_activation=None)
    w_activation = get_outputs(use_activation=True)
    wo_activation = get_outputs(use_activation=False)

    assert torch.allclose(default, w_activation, atol=1e-2), "Default should use activation."
    assert not torch.allclose(w_activation, wo_activation, atol=1e-2), (
        "wo_activation should not use activation."
    )
    assert torch.allclose(F.sigmoid(wo_activation), w_activation, atol=1e-2), (
        "w_activation should be close to activation(wo_activation)."
    )


@pytest.mark.parametrize("path", PATHS)
def test_rerank_max_tokens_per_doc(server, path):
    """test_rerank_max_tokens_per_doc."""
    long_doc = "The capital of France is Paris. " * 50
    short_doc = "The capital of Brazil is Brasilia."
    rerank_response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                          "documents": [long_doc, short_doc],
                                          "max_tokens_per_doc": 10})  # fmt: skip
    rerank_response.raise_for_status()
    rerank = RerankResponse.model_validate(rerank_response.json())

    assert rerank.id is not None
    assert rerank.results is not None
    assert len(rerank.results) == 2
    assert rerank.usage.prompt_tokens > 0


@pytest.mark.parametrize("path", PATHS)
def test_rerank_max_tokens_per_doc_reduces_tokens(server, path):
    """test_rerank_max_tokens_per_doc_reduces_tokens: truncate_prompt_tokens 99 cuts the
    whole prompt (ours: the document, the ranker's prompt kept whole), max_tokens_per_doc
    10 the document."""
    long_doc = "The capital of France is Paris. " * 10
    response_no_limit = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                            "documents": [long_doc],
                                            "truncate_prompt_tokens": 99})  # fmt: skip
    response_no_limit.raise_for_status()
    rerank_no_limit = RerankResponse.model_validate(response_no_limit.json())
    response_with_limit = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                              "documents": [long_doc],
                                              "max_tokens_per_doc": 10})  # fmt: skip
    response_with_limit.raise_for_status()
    rerank_with_limit = RerankResponse.model_validate(response_with_limit.json())

    assert rerank_with_limit.usage.prompt_tokens < rerank_no_limit.usage.prompt_tokens


@pytest.mark.parametrize("path", PATHS)
def test_rerank_max_tokens_per_doc_validation(server, path):
    """test_rerank_max_tokens_per_doc_validation."""
    for value in (0, -5):
        response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                       "documents": ["The capital of France is Paris."],
                                       "max_tokens_per_doc": value})  # fmt: skip
        assert response.status_code == 400
        assert "max_tokens_per_doc must be a positive integer" in response.text


@pytest.mark.parametrize("path", PATHS)
def test_score_max_tokens_per_doc_with_score_template(server, path):
    """test_score_max_tokens_per_doc_with_score_template (vLLM's score template is its
    cross-encoder prompt; ours, the ranker's prompt)."""
    long_doc = "The capital of France is Paris. " * 20
    rerank_response = post(server, path, {"model": MODEL_NAME, "query": QUERY,
                                          "documents": [long_doc],
                                          "max_tokens_per_doc": 15})  # fmt: skip
    rerank_response.raise_for_status()
    rerank = RerankResponse.model_validate(rerank_response.json())
    assert rerank.results is not None
    assert len(rerank.results) == 1
    assert rerank.usage.prompt_tokens > 0


def test_a_cohere_request_that_asks_for_no_documents_gets_no_document_key(server):
    """Not a vLLM test: the other side of the collision on /v1/rerank (docs/server.md,
    "Peer conventions on one path"): Cohere's `return_documents: false` leaves the key
    out (never null), and so does a body carrying a field only Cohere's API has."""
    for extra in ({"return_documents": False}, {"rank_fields": ["text"]}):
        answer = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, **extra})
        assert answer.status_code == 200, answer.text
        assert all("document" not in r for r in answer.json()["results"])


@pytest.mark.skip(reason="vLLM's /pooling API (raw pooler outputs of a pooling model) is "
                  "not served: a generative model has no pooler")  # fmt: skip
def test_pooling_classify():
    """test_pooling_classify, test_pooling_token_classify, test_pooling_not_supported."""
