"""vLLM's `logprob_token_ids` tests, ported: vllm-project/vllm
tests/entrypoints/openai/chat_completion/test_logprob_token_ids.py (Apache-2.0),
rewritten with their assertions kept, run with the real `openai` client against
`prefillonly serve`.

Adaptations:
- the server: vLLM starts Qwen/Qwen2.5-1.5B-Instruct; here the session's server of the
  default model (SmolLM2-135M-Instruct), shared with other modules;
- vLLM's request-model tests (to_sampling_params, ValidationError) test its internals;
  their observable effect is asserted over HTTP instead (the named ids replace the top-k;
  the refusals of logprob_token_ids with nothing generated, or with use_beam_search, are
  400s with vLLM's wording).
The cases pin the sampled token with `allowed_token_ids`, as vLLM's do
(single_token/allowed_tokens.py).
"""

from __future__ import annotations

import asyncio
import math

import openai
import pytest
import requests

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


AS_IDS = {"return_tokens_as_token_ids": True}  # vLLM's tests read every token as its id


def token_id(token: str) -> int:
    assert token.startswith("token_id:"), (
        f"expected return_tokens_as_token_ids=True to yield the `token_id:<int>` form, got "
        f"{token!r}"
    )
    return int(token.removeprefix("token_id:"))


def _entries(response):
    return response.choices[0].logprobs.content[0].top_logprobs


@pytest.mark.parametrize(
    ("requested_ids", "top_logprobs", "sampled_id"),
    [
        pytest.param([5000], 5, 42, id="original-issue-shape"),
        pytest.param([100, 1000, 5000], 3, 42, id="sampled-outside-set"),
        pytest.param([100, 1000, 5000], 3, 5000, id="sampled-inside-set"),
    ],
)
def test_logprob_token_ids_returns_requested_ids(
    client, model, requested_ids, top_logprobs, sampled_id
):
    """test_logprob_token_ids_returns_requested_ids: the sampled token is the one allowed,
    and the position lists the named ids and it, each once."""
    response = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=1,
        temperature=0,
        logprobs=True,
        top_logprobs=top_logprobs,
        extra_body={
            "logprob_token_ids": requested_ids,
            "allowed_token_ids": [sampled_id],
            **AS_IDS,
        },
    )
    entries = _entries(response)
    returned = [token_id(entry.token) for entry in entries]
    assert token_id(response.choices[0].logprobs.content[0].token) == sampled_id
    assert set(returned) == {*requested_ids, sampled_id}
    assert len(returned) == len(set(returned))
    for entry in entries:
        assert isinstance(entry.logprob, float)
        assert not math.isnan(entry.logprob)
        assert not math.isinf(entry.logprob)


def test_logprob_token_ids_stream_with_no_top_k(server, model):
    """test_logprob_token_ids_stream_with_no_top_k (the async client, streamed)."""

    async def stream_tokens():
        async with openai.AsyncOpenAI(api_key="none", base_url=f"{server.url}/v1") as client:
            stream = await client.chat.completions.create(
                model=model,
                messages=MESSAGES,
                max_tokens=1,
                temperature=0,
                logprobs=True,
                top_logprobs=None,
                stream=True,
                extra_body={"logprob_token_ids": [5000], "allowed_token_ids": [42], **AS_IDS},
            )
            returned = []
            async for chunk in stream:
                if not chunk.choices or chunk.choices[0].logprobs is None:
                    continue
                for content in chunk.choices[0].logprobs.content:
                    returned.extend(token_id(entry.token) for entry in content.top_logprobs)
            return returned

    assert set(asyncio.run(stream_tokens())) == {42, 5000}


def test_logprob_token_ids_default_behavior_unchanged(client, model):
    """test_logprob_token_ids_default_behavior_unchanged: without the field, the natural
    top-k of log-softmax values."""
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True, top_logprobs=5
    )
    entries = _entries(response)
    assert len(entries) == 5
    assert all(entry.logprob <= 0.0 for entry in entries)


def test_completion_request_decouples_top_k_from_explicit_token_ids(client, model):
    """test_completion_request_decouples_top_k_from_explicit_token_ids, over HTTP: with
    logprobs=5 and logprob_token_ids=[5000] the position lists the named id (and the
    sampled one), not a top 5."""
    response = client.completions.create(
        model=model,
        prompt="Hello",
        max_tokens=1,
        temperature=0,
        logprobs=5,
        extra_body={"logprob_token_ids": [5000], **AS_IDS},
    )
    top = response.choices[0].logprobs.top_logprobs[0]
    sampled = token_id(response.choices[0].logprobs.tokens[0])
    assert {token_id(token) for token in top} == {5000, sampled}


def test_completion_rejects_explicit_token_ids_without_generated_tokens(server, model):
    """test_completion_rejects_explicit_token_ids_without_generated_tokens: a 400 (vLLM:
    its request model's ValidationError) with vLLM's words."""
    response = requests.post(
        f"{server.url}/v1/completions",
        json={
            "model": model,
            "prompt": "Hello",
            "echo": True,
            "max_tokens": 0,
            "logprobs": 5,
            "logprob_token_ids": [5000],
        },
        timeout=60,
    )
    assert response.status_code == 400
    assert "no output tokens are generated" in response.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_requests_reject_explicit_token_ids_with_beam_search(server, model, path):
    """test_requests_reject_explicit_token_ids_with_beam_search, over HTTP: a 400 (vLLM:
    its request models' ValidationError) with vLLM's words, for chat and completions."""
    body = {"model": model, "logprob_token_ids": [5000], "use_beam_search": True}
    if path == "/v1/completions":
        body.update(prompt="Hello", logprobs=5)
    else:
        body.update(messages=MESSAGES, logprobs=True)
    response = requests.post(f"{server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400
    assert "not supported with beam search" in response.text


def test_completions_accept_logprobs_true(client, model):
    """Not in vLLM's file: vLLM's and SGLang's request models read completions' `logprobs:
    true` as 1, so a client sending it gets the sampled token's logprob and one more."""
    response = client.completions.create(
        model=model, prompt="Hello", max_tokens=1, temperature=0, extra_body={"logprobs": True}
    )
    assert len(response.choices[0].logprobs.top_logprobs[0]) == 1
