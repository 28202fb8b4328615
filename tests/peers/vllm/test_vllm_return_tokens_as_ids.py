"""vLLM's `return_tokens_as_token_ids` tests, ported: vllm-project/vllm
tests/entrypoints/openai/test_return_tokens_as_ids.py (Apache-2.0), with their assertions
kept, run with the real `openai` client against `prefillonly serve`.

Adaptations:
- the server: vLLM starts HuggingFaceH4/zephyr-7b-beta, once with its server flag
  `--return-tokens-as-token-ids` and once without (the request's field instead); here the
  session's server of the default model (SmolLM2-135M-Instruct), which takes the
  request's field (the server flag is not ported: both cases send the field);
- completions' `top_logprobs` are SGLang's: a position's top-k alone (vLLM adds the
  position's own token first), so their keys are compared with the tokens where those
  are the top-1, the tokens generated at temperature 0.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the default model's server

AS_IDS = {"return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def server(default_server):
    return default_server


@pytest.fixture(scope="module")
def tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path)


def test_completion_return_tokens_as_token_ids_completion(client, model, tokenizer):
    """test_completion_return_tokens_as_token_ids_completion (its request-field case)."""
    completion = client.completions.create(
        model=model,
        # A character split across tokens: its tokens' texts alone are not text.
        prompt="Say 'Hello, world! 🎉'",
        echo=True,
        temperature=0,
        max_tokens=10,
        logprobs=1,
        extra_body=AS_IDS,
    )
    text = completion.choices[0].text
    token_strs = completion.choices[0].logprobs.tokens
    # The first position has no logprob (nothing before it to score it).
    top_logprobs = completion.choices[0].logprobs.top_logprobs[1:]
    top_logprob_keys = [next(iter(logprob_by_tokens)) for logprob_by_tokens in top_logprobs]
    assert all(key.startswith("token_id:") for key in top_logprob_keys)
    # Adapted: SGLang's top_logprobs hold the top-k alone (vLLM's put the position's own
    # token first), so the keys are the tokens where the token is the top-1: those
    # generated at temperature 0.
    generated = completion.usage.completion_tokens
    assert token_strs[-generated:] == top_logprob_keys[-generated:]
    tokens = [int(token.removeprefix("token_id:")) for token in token_strs]
    assert text == tokenizer.decode(tokens, skip_special_tokens=True)


def test_chat_return_tokens_as_token_ids_completion(client, model, tokenizer):
    """test_chat_return_tokens_as_token_ids_completion (its request-field case)."""
    response = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You like to respond in only emojis, like 🎉"},
            {"role": "user", "content": "Please write some emojis: 🐱🐶🎉"},
        ],
        temperature=0,
        max_tokens=8,
        logprobs=True,
        extra_body=AS_IDS,
    )
    text = response.choices[0].message.content
    token_ids = [
        int(c.token.removeprefix("token_id:")) for c in response.choices[0].logprobs.content
    ]
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == text
