"""vLLM's generative-scoring tests, ported: vllm-project/vllm
tests/entrypoints/generate/generative_scoring/ (test_generative_scoring_e2e.py and
test_generative_scoring.py), Apache-2.0, with their assertions kept, on POST
/generative_scoring (apis/vllm_generative_scoring.py).

Adaptations (each also said where it applies):
- the model and server: vLLM starts Qwen/Qwen3-0.6B; here the session's `default_server`
  (SmolLM2-135M-Instruct, vocabulary 49152). The label ids vLLM uses (9454, 2753, 100,
  200) are inside that vocabulary too and are kept;
- test_generative_scoring.py drives vLLM's serving class with a mocked AsyncLLM: its
  protocol, probability, validation, prompt-order and generation tests are asserted here
  on the running server's answers instead, the probabilities against a transformers
  forward of the same prompts (prefillonly_sgl.verification.reference) where vLLM checks its formula
  on mocked logprobs; the one test of the mock itself (an engine that yields nothing
  answers 500) has no counterpart and is not ported.
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


def post(server, body):
    return requests.post(f"{server.url}/generative_scoring", json=body, timeout=120)


def scored(server, body) -> ScoreResponse:
    response = post(server, {"model": MODEL_NAME, **body})
    assert response.status_code == 200, f"Response: {response.text}"
    return ScoreResponse.model_validate(response.json())


# test_generative_scoring_e2e.py


def test_basic_score_and_response_structure(server):
    """TestGenerativeScoringAPI.test_basic_score_and_response_structure."""
    response = post(server, {
        "model": MODEL_NAME,
        "query": "Is Paris the capital of France? Answer Yes or No: ",
        "items": ["Paris is beautiful.", "London is rainy."],
        "label_token_ids": [9454, 2753],
    })  # fmt: skip
    assert response.status_code == 200, f"Response: {response.text}"
    data = response.json()
    assert data["id"].startswith("generative-scoring-")
    assert data["object"] == "list"
    assert "model" in data
    assert "usage" in data
    assert len(data["data"]) == 2
    for i, result in enumerate(data["data"]):
        assert result["index"] == i
        assert result["object"] == "score"
        assert 0.0 <= result["score"] <= 1.0
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_multiple_items(server):
    """TestGenerativeScoringAPI.test_multiple_items."""
    answer = scored(server, {"query": "Is this city a capital? ",
                             "items": ["Paris", "London", "Berlin", "New York", "Tokyo"],
                             "label_token_ids": [9454, 2753]})  # fmt: skip
    assert len(answer.data) == 5


def test_validation_missing_label_token_ids(server):
    """TestGenerativeScoringAPI.test_validation_missing_label_token_ids; ours also names
    the field."""
    response = post(server, {"model": MODEL_NAME, "query": "Test query",
                             "items": ["item1", "item2"]})  # fmt: skip
    assert response.status_code == 400
    assert "label_token_ids" in response.json()["error"]["message"]


def test_validation_empty_items(server):
    """TestGenerativeScoringAPI.test_validation_empty_items."""
    response = post(server, {"model": MODEL_NAME, "query": "Test query", "items": [],
                             "label_token_ids": [100, 200]})  # fmt: skip
    assert response.status_code == 400


@pytest.mark.parametrize("label_token_ids,expected_status",
                         [([9999999999, 9999999998], 400)], ids=["invalid_token_ids"])  # fmt: skip
def test_validation_errors(server, label_token_ids, expected_status):
    """TestGenerativeScoringAPI.test_validation_errors."""
    response = post(server, {"model": MODEL_NAME, "query": "Test query", "items": ["item1"],
                             "label_token_ids": label_token_ids})  # fmt: skip
    assert response.status_code == expected_status


def test_score_consistency(server):
    """TestGenerativeScoringAPI.test_score_consistency."""
    body = {"query": "Is this consistent? ", "items": ["Yes it is."], "label_token_ids": [100, 200]}
    first, second = scored(server, body), scored(server, body)
    assert (
        abs(first.data[0].score - second.data[0].score) < 1e-4
    )  # a cache hit against a cold forward: float32 sums in another order


# test_generative_scoring.py


def test_request_and_response_all_fields(server):
    """TestProtocolModels.test_request_and_response_all_fields: both request forms (texts
    with the defaults; token ids with every option set) are taken, and the answer has
    vLLM's shape. Adapted: sent to the server, not built as vLLM's models."""
    for body in (
        {"query": "Is this the capital?", "items": ["Paris", "London"],
         "label_token_ids": [9454, 2753]},
        {"query": [100, 200, 300], "items": [[400, 500], [600, 700]],
         "label_token_ids": [1234, 5678], "apply_softmax": False, "item_first": True,
         "add_special_tokens": False},
    ):  # fmt: skip
        answer = scored(server, body)
        assert answer.object == "list"
        assert answer.model
        assert len(answer.data) == 2
        assert all(d.object == "score" for d in answer.data)
        assert answer.usage.prompt_tokens > 0


@pytest.mark.parametrize("apply_softmax", [True, False], ids=["softmax", "true_probs"])
def test_compute_probabilities(server, default_reference, apply_softmax):
    """TestProbabilityComputation.test_compute_probabilities and test_score_formula: with
    apply_softmax the labels' probabilities sum to one (each label's score is its
    softmax over the labels, P(t0) / (P(t0) + P(t1))); without, they are the model's
    over the whole vocabulary (sum below one). Adapted: each label's probability is the
    score with it first, checked against a transformers forward of the same prompt
    (vLLM: its formula on mocked logprobs)."""
    query, items, labels = [504, 3458, 314], [[2644]], [9454, 2753, 100]
    probs = []
    for i in range(len(labels)):
        order = labels[i:] + labels[:i]
        body = {"query": query, "items": items, "label_token_ids": order,
                "apply_softmax": apply_softmax}  # fmt: skip
        probs.append(scored(server, body).data[0].score)
    expected = default_reference.score(query, items, labels, apply_softmax)[0]
    assert probs == pytest.approx(expected, abs=1e-4)
    if apply_softmax:
        assert abs(sum(probs) - 1.0) < 1e-4
    else:
        assert sum(probs) < 1.0


@pytest.mark.parametrize(
    "label_token_ids,expected_error",
    [([999999, 999998], "out of vocabulary"), ([100, 200], "at least one item")],
    ids=["invalid_token_id", "empty_items"],
)
def test_validation_error_messages(server, label_token_ids, expected_error):
    """TestValidation.test_validation_errors (vLLM's ErrorResponse is its 400 body)."""
    items = [] if expected_error == "at least one item" else ["i"]
    response = post(server, {"model": MODEL_NAME, "query": "q", "items": items,
                             "label_token_ids": label_token_ids})  # fmt: skip
    assert response.status_code == 400
    assert expected_error in response.json()["error"]["message"].lower()


@pytest.mark.parametrize("item_first,prompts",
                         [(False, [[100, 101, 200, 201], [100, 101, 300, 301]]),
                          (True, [[200, 201, 100, 101], [300, 301, 100, 101]])],
                         ids=["query_first", "item_first"])  # fmt: skip
def test_item_ordering(server, item_first, prompts):
    """TestPromptBuilding.test_item_ordering: item_first puts each item before the query.
    Adapted: vLLM reads the built prompts off its mock; here each item's score equals the
    score of the expected prompt sent whole (its last token as the item)."""
    answer = scored(server, {"query": [100, 101], "items": [[200, 201], [300, 301]],
                             "label_token_ids": [500, 501], "item_first": item_first})  # fmt: skip
    for i, prompt in enumerate(prompts):
        whole = scored(server, {"query": prompt[:-1], "items": [prompt[-1:]],
                                "label_token_ids": [500, 501]})  # fmt: skip
        # Same tokens, split differently between the cached prefix and the item: the
        # float32 sums differ in their last digits.
        assert answer.data[i].score == pytest.approx(whole.data[0].score, abs=1e-4)


@pytest.mark.parametrize("cache_salt", [None, "tenant-a"])
@pytest.mark.parametrize(
    "query,items",
    [("Is this city the capital of France? ", ["Paris", "London"]),
     ([100, 101], [[200, 201], [300, 301]])],
    ids=["text", "token_ids"],
)  # fmt: skip
def test_successful_generation(server, cache_salt, query, items):
    """TestGeneration.test_successful_generation. Adapted: vLLM checks on its mock that
    each prompt carries the salt; here a salted request is answered like an unsalted one
    (the salt only separates prefix caches)."""
    body = {"query": query, "items": items, "label_token_ids": [1234, 5678]}
    answer = scored(server, {**body, "cache_salt": cache_salt} if cache_salt else body)
    assert len(answer.data) == 2
    for item_result in answer.data:
        assert 0.0 <= item_result.score <= 1.0
    if cache_salt:
        plain = scored(server, body)
        # The project's float32 tolerance: the plain call may read the salted one's query
        # from no cache, or its own, and sum in another order (1.24e-6 on a 2-core EPYC).
        assert [d.score for d in answer.data] == pytest.approx([d.score for d in plain.data],
                                                               abs=1e-4)  # fmt: skip
