"""vLLM's classify tests, ported: vllm-project/vllm
tests/entrypoints/pooling/classify/test_online.py, Apache-2.0, with their assertions kept,
on /v1/classify.

Adaptations (each also said where it applies):
- the model and server: vLLM starts jason9693/Qwen2.5-1.5B-apeach (a trained
  sequence-classification checkpoint, labels "Default" / "Spoiled", --max-model-len 512);
  /v1/classify here is a DSL classifier on a generative model, so the session's
  `apps_server` (the tiny random Llama with `--classify review_sentiment`, labels
  "positive" / "very negative": tests/ranking_app_example.py), shared with
  tests/test_ranking_apis.py and tests/test_app_endpoints.py;
- the path: vLLM's test posts /classify; we serve /v1/classify (vLLM serves both);
- token ids (`input_tokens`) are the tiny tokenizer's ids of the same text;
- counts that depend on vLLM's model (usage.prompt_tokens == 5 after truncation, 51 / 54
  / 49 for the chat) become the same request with its input cut, or its chat rendered,
  by hand with the tokenizer (an independent rendering): same tokens, same probabilities.
  A classifier's prompt wraps its input, so truncate_prompt_tokens cuts the input;
- the boundary of truncate_prompt_tokens: one token more than the server's context
  (vLLM: 513 for its 512).
vLLM's ClassificationResponse is restated in vllm_response_models.py.
"""

from __future__ import annotations

import pytest
import requests
import torch
import torch.nn.functional as F
from vllm_response_models import ClassificationResponse

pytestmark = pytest.mark.slow  # the apps server

LABELS = ["positive", "very negative"]  # vLLM: ["Default", "Spoiled"]
input_text = "This product was excellent and exceeded my expectations"
MESSAGES = [
    {"role": "user", "content": "The cat sat on the mat."},
    {"role": "assistant", "content": "A feline was resting on a rug."},
    {"role": "user", "content": "Stars twinkle brightly in the night sky."},
]


@pytest.fixture(scope="module")
def server(apps_server):
    return apps_server  # tests/conftest.py: the DSL apps, --classify review_sentiment


@pytest.fixture(scope="module")
def model_name(model):
    return model  # vLLM's tests name it model_name (conftest.py's `model`)


@pytest.fixture(scope="module")
def input_tokens(reference):
    return reference.tokenizer.encode(input_text, add_special_tokens=False)


def classify(server, body):
    return requests.post(f"{server.url}/v1/classify", json=body, timeout=120)


def parsed(response) -> ClassificationResponse:
    response.raise_for_status()
    return ClassificationResponse.model_validate(response.json())


def test_basic(server, model_name, reference):
    """test_basic: /v1/models and /tokenize (adapted: the tiny tokenizer's ids)."""
    info = requests.get(f"{server.url}/get_model_info").json()
    assert model_name == info["model_path"]
    response = requests.post(f"{server.url}/tokenize",
                             json={"model": model_name, "prompt": input_text})  # fmt: skip
    assert response.json()["tokens"] == reference.tokenizer.encode(input_text)


def test_completion_request(server, model_name, input_tokens):
    """test_completion_request: a text, then its token ids (which classify the same)."""
    by_text = parsed(classify(server, {"model": model_name, "input": input_text}))
    assert by_text.object == "list"
    assert by_text.model == model_name
    assert len(by_text.data) == 1
    assert hasattr(by_text.data[0], "label")
    assert hasattr(by_text.data[0], "probs")

    output = parsed(classify(server, {"model": model_name, "input": input_tokens}))
    assert output.object == "list"
    assert output.model == model_name
    assert len(output.data) == 1
    assert hasattr(output.data[0], "label")
    assert hasattr(output.data[0], "probs")
    # Ours too: token ids are the text they decode to.
    assert output.data[0].probs == pytest.approx(by_text.data[0].probs, abs=1e-6)


def test_completion_request_batched(server, model_name, input_tokens):
    """test_completion_request_batched."""
    N = 10
    for batch in ([input_text] * N, [input_tokens] * N):
        output = ClassificationResponse.model_validate(
            classify(server, {"model": model_name, "input": batch}).json()
        )
        assert len(output.data) == N
        for i, item in enumerate(output.data):
            assert item.index == i
            assert hasattr(item, "label")
            assert hasattr(item, "probs")
            assert len(item.probs) == item.num_classes
            assert item.label in LABELS


def test_empty_input_error(server, model_name):
    """test_empty_input_error."""
    for empty in ("", []):
        classification_response = classify(server, {"model": model_name, "input": empty})
        error = classification_response.json()
        assert classification_response.status_code == 400
        assert "error" in error
        assert "input is empty" in error["error"]["message"]  # ours: names the field


def test_truncate_prompt_tokens(server, model_name, reference):
    """test_truncate_prompt_tokens. Adapted: vLLM counts 5 prompt tokens (its whole
    prompt cut to 5); a classifier's prompt wraps the input, so the input is cut to 5
    tokens: the answer equals the one for those 5 tokens sent by hand."""
    long_text = "hello " * 600
    classification_response = classify(server, {"model": model_name, "input": long_text,
                                                 "truncate_prompt_tokens": 5})  # fmt: skip
    output = parsed(classification_response)
    assert len(output.data) == 1
    assert output.data[0].index == 0
    assert hasattr(output.data[0], "probs")
    tokenizer = reference.tokenizer
    first_five = tokenizer.decode(tokenizer.encode(long_text, add_special_tokens=False)[:5])
    by_hand = parsed(classify(server, {"model": model_name, "input": first_five}))
    assert output.usage.prompt_tokens == by_hand.usage.prompt_tokens  # vLLM: == 5
    assert output.usage.total_tokens == output.usage.prompt_tokens  # vLLM: == 5
    assert output.data[0].probs == pytest.approx(by_hand.data[0].probs, abs=1e-6)

    # invalid_truncate_prompt_tokens: more than the context (vLLM: 513 for 512)
    too_many = requests.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"] + 1
    classification_response = classify(server, {"model": model_name, "input": "test",
                                                 "truncate_prompt_tokens": too_many})  # fmt: skip
    error = classification_response.json()
    assert classification_response.status_code == 400
    assert "truncate_prompt_tokens" in error["error"]["message"]


def test_a_too_long_input_is_refused_naming_it(server, model_name):
    """Not a vLLM test: without truncate_prompt_tokens an input longer than the prompt
    can hold is a 400 naming it (and how to cut it), never a silent cut."""
    response = classify(server, {"model": model_name, "input": ["fine", "hello " * 5000]})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "input[1]" in message and "truncate_prompt_tokens" in message


def test_add_special_tokens(server, model_name):
    """test_add_special_tokens (accepted both ways)."""
    for add in (False, True):
        response = classify(server, {"model": model_name, "input": input_text,
                                     "add_special_tokens": add})  # fmt: skip
        response.raise_for_status()
        ClassificationResponse.model_validate(response.json())


def test_chat_request(server, model_name, reference):
    """test_chat_request. Adapted: vLLM's token counts (51, 54, 49, 51) are its model's;
    here each count and answer equal the same chat rendered by hand with the chat
    template and sent as the input."""
    tokenizer = reference.tokenizer

    def check(options: dict, render: dict):
        response = classify(server, {"model": model_name, "messages": MESSAGES, **options})
        output = parsed(response)
        assert output.object == "list"
        assert output.model == model_name
        assert len(output.data) == 1
        assert hasattr(output.data[0], "label")
        assert hasattr(output.data[0], "probs")
        text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, **render)
        by_hand = parsed(classify(server, {"model": model_name, "input": text}))
        assert output.usage.prompt_tokens == by_hand.usage.prompt_tokens
        assert output.data[0].probs == pytest.approx(by_hand.data[0].probs, abs=1e-6)
        return output.usage.prompt_tokens

    basic = check({}, {})
    with_prompt = check({"add_generation_prompt": True}, {"add_generation_prompt": True})
    continued = check({"continue_final_message": True}, {"continue_final_message": True})
    special = check({"add_special_tokens": True}, {})
    assert with_prompt > basic > continued  # vLLM: 54 > 51 > 49
    assert special == basic  # vLLM: 51 (the template brings the special tokens)

    response = classify(server, {"model": model_name, "messages": MESSAGES,
                                 "continue_final_message": True,
                                 "add_generation_prompt": True})  # fmt: skip
    assert (
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        in response.json()["error"]["message"]
    )


@pytest.mark.skip(reason="SageMaker's /invocations is SGLang's own route: it does not "
                  "dispatch to our /v1/classify")  # fmt: skip
def test_invocations_completion_request():
    """test_invocations_completion_request, test_invocations_chat_request."""


def test_use_activation(server, model_name):
    """test_use_activation: use_activation false gives the scores before the softmax
    (ours: the labels' log-probabilities)."""

    def get_outputs(use_activation):
        response = classify(server, {"model": model_name, "input": input_text,
                                     "use_activation": use_activation})  # fmt: skip
        outputs = response.json()
        return torch.tensor([x["probs"] for x in outputs["data"]])

    default = get_outputs(use_activation=None)
    w_activation = get_outputs(use_activation=True)
    wo_activation = get_outputs(use_activation=False)

    assert torch.allclose(default, w_activation, atol=1e-2), "Default should use activation."
    assert not torch.allclose(w_activation, wo_activation, atol=1e-2), (
        "wo_activation should not use activation."
    )
    assert torch.allclose(F.softmax(wo_activation, dim=-1), w_activation, atol=1e-2), (
        "w_activation should be close to activation(wo_activation)."
    )


@pytest.mark.skip(reason="vLLM answers 404 for /score and /rerank on a classifier with "
                  "num_labels != 1; ours serve both with the server's reranker "
                  "(test_vllm_rerank.py, test_vllm_score.py)")  # fmt: skip
def test_score_and_rerank_not_found():
    """test_score, test_rerank."""


@pytest.mark.skip(reason="vLLM's /pooling API (raw pooler outputs of a pooling model) is "
                  "not served: a generative model has no pooler")  # fmt: skip
def test_pooling_classify():
    """test_pooling_classify, test_pooling_token_classify, test_pooling_not_supported."""
