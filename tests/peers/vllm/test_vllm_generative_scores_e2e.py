"""vLLM's score tests with label_token_ids on a causal LM, ported: vllm-project/vllm
tests/entrypoints/pooling/score/test_generative_scores_e2e.py (TestScoreAPIWithCausalLM),
Apache-2.0, with their assertions kept, on /v1/score: vLLM's score body with
`label_token_ids` is its generative scoring (apis/vllm_generative_scoring.py), told from
SGLang's body by its own keys (docs/server.md, "Peer conventions on one path").

Adaptations (each also said where it applies):
- the model and server: vLLM starts Qwen/Qwen3-0.6B; here the session's `default_server`
  (SmolLM2-135M-Instruct). vLLM's label ids fit its vocabulary too and are kept;
- a body with no `label_token_ids` key at all is, on this server, vLLM's cross-encoder
  score shape, answered by the server's reranker (test_vllm_score.py): the missing-label
  test sends `label_token_ids: null`, which vLLM refuses the same way;
- TestLogprobTokenIds (a completions request with logprobs) is covered by
  test_vllm_logprob_token_ids.py.
Not vLLM's: vLLM's body on /v1/score and on /generative_scoring gives SGLang's /v1/score
probabilities for the same prompts.
"""

from __future__ import annotations

import pytest
import requests
from vllm_response_models import ScoreResponse

pytestmark = pytest.mark.slow  # the default model's server

MODEL_NAME = "default"  # vLLM: "Qwen/Qwen3-0.6B"


@pytest.fixture(scope="module")
def server(default_server):
    return default_server  # the session's default-model server (tests/conftest.py)


def post(server, body, path="/v1/score"):
    return requests.post(f"{server.url}{path}", json={"model": MODEL_NAME, **body}, timeout=120)


def scored(server, body) -> ScoreResponse:
    response = post(server, body)
    assert response.status_code == 200, f"Response: {response.text}"
    return ScoreResponse.model_validate(response.json())


def test_basic_score_request(server):
    """test_basic_score_request."""
    response = post(server, {"queries": "Is Paris the capital of France? Answer with Yes or No: ",
                             "documents": ["Paris is beautiful.", "London is rainy."],
                             "label_token_ids": [9454, 2753]})  # fmt: skip
    assert response.status_code == 200, f"Response: {response.text}"
    data = response.json()
    assert "id" in data
    assert data["id"].startswith("score-")
    assert data["object"] == "list"
    assert "model" in data
    assert "data" in data
    assert "usage" in data
    assert len(data["data"]) == 2
    for i, result in enumerate(data["data"]):
        assert result["index"] == i
        assert result["object"] == "score"
        assert "score" in result
        assert 0.0 <= result["score"] <= 1.0


def test_score_with_multiple_documents(server):
    """test_score_with_multiple_documents."""
    answer = scored(server, {"queries": "Is this city a capital? ",
                             "documents": ["Paris", "London", "Berlin", "New York", "Tokyo"],
                             "label_token_ids": [9454, 2753]})  # fmt: skip
    assert len(answer.data) == 5
    for i, result in enumerate(answer.data):
        assert result.index == i
        assert 0.0 <= result.score <= 1.0


def test_score_validation_missing_label_token_ids(server):
    """test_score_validation_missing_label_token_ids. Adapted: `label_token_ids: null`
    (without the key the body is vLLM's cross-encoder shape, which the reranker
    answers here)."""
    response = post(server, {"queries": "Test query", "documents": ["doc1", "doc2"],
                             "label_token_ids": None})  # fmt: skip
    assert response.status_code == 400
    data = response.json()
    assert "error" in data
    assert "label_token_ids" in data["error"]["message"].lower()


def test_score_validation_empty_label_tokens(server):
    """test_score_validation_empty_label_tokens."""
    response = post(server, {"queries": "Test query", "documents": ["item1"],
                             "label_token_ids": []})  # fmt: skip
    assert response.status_code == 400
    data = response.json()
    assert "error" in data
    assert "at least one token" in data["error"]["message"].lower()


def test_score_validation_invalid_token_id(server):
    """test_score_validation_invalid_token_id."""
    response = post(server, {"queries": "Test query", "documents": ["item1"],
                             "label_token_ids": [9999999999]})  # fmt: skip
    assert response.status_code == 400
    data = response.json()
    assert "error" in data
    assert "out of vocabulary range" in data["error"]["message"].lower()


def test_score_usage_tracking(server):
    """test_score_usage_tracking."""
    answer = scored(server, {"queries": "A test query with multiple tokens ",
                             "documents": ["item one", "item two", "item three"],
                             "label_token_ids": [100, 200]})  # fmt: skip
    usage = answer.usage
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_score_consistency(server):
    """test_score_consistency."""
    body = {"queries": "Is this consistent? ", "documents": ["Yes it is."],
            "label_token_ids": [100, 200, 300]}  # fmt: skip
    first, second = scored(server, body), scored(server, body)
    assert abs(first.data[0].score - second.data[0].score) < 1e-6


def test_score_with_many_label_tokens(server):
    """test_score_with_many_label_tokens."""
    answer = scored(server, {"queries": "Test query ", "documents": ["item1"],
                             "label_token_ids": list(range(100, 200))})  # fmt: skip
    assert 0.0 <= answer.data[0].score <= 1.0


@pytest.mark.parametrize("apply_softmax", [True, False])
def test_both_vllm_paths_give_sglangs_probabilities(server, default_reference, apply_softmax):
    """Not vLLM's: vLLM's body on /v1/score and on /generative_scoring scores each item as
    SGLang's /v1/score body does for the same prompts (vLLM's tokenization: the query with
    special tokens, each item without), its first label's probability."""
    tokenizer = default_reference.tokenizer
    query, documents = "Is this city a capital? Answer: ", ["Paris", "New York"]
    labels = [9454, 2753, 100]
    query_ids = tokenizer.encode(query, add_special_tokens=True)
    item_ids = [tokenizer.encode(d, add_special_tokens=False) for d in documents]
    sglang = requests.post(f"{server.url}/v1/score", json={
        "query": query_ids, "items": item_ids, "label_token_ids": labels,
        "apply_softmax": apply_softmax})  # fmt: skip
    assert sglang.status_code == 200, sglang.text
    expected = [row[0] for row in sglang.json()["scores"]]
    common = {"label_token_ids": labels, "apply_softmax": apply_softmax}
    on_score = scored(server, {"queries": query, "documents": documents, **common})
    on_generative = post(server, {"query": query, "items": documents, **common},
                         path="/generative_scoring")  # fmt: skip
    assert on_generative.status_code == 200, on_generative.text
    generative = ScoreResponse.model_validate(on_generative.json())
    for answer in (on_score, generative):
        assert [d.score for d in answer.data] == pytest.approx(expected, abs=1e-6)
        prompt_tokens = sum(len(query_ids) + len(ids) for ids in item_ids)
        assert answer.usage.prompt_tokens == prompt_tokens
        assert answer.usage.completion_tokens == len(documents)


def test_sglangs_body_and_the_reranker_shape_stay_theirs(server):
    """Not vLLM's: SGLang's body (`query`) with label_token_ids keeps SGLang's answer, and
    vLLM's score body without label_token_ids its reranker score."""
    sglang = post(server, {"query": "Is it? ", "items": ["Yes"], "label_token_ids": [100, 200]})
    assert sglang.status_code == 200 and "scores" in sglang.json()
    reranked = post(server, {"queries": "Is it? ", "documents": ["Yes"]})
    assert reranked.status_code == 200 and reranked.json()["data"][0]["object"] == "score"
