"""SGLang's custom-logit-processor tests, ported: sgl-project/sglang
test/srt/openai_server/basic/test_openai_server.py (class
TestOpenAIServerCustomLogitProcessor; Apache-2.0), with their assertions kept.

Adaptations: SGLang launches its small model with `--enable-custom-logit-processor`; here
the session's tiny-Llama server that carries the peers' switches
(`peer_conventions_server`, started with that flag too); the chat goes through the
server's own /v1/chat/completions route (prefillonly's, on SGLang's handler).
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

PROCESSOR_SOURCE = """
class DeterministicLogitProcessor(CustomLogitProcessor):
    CUSTOM_PARAM_KEY = "token_id"

    def __call__(self, logits, custom_param_list):
        assert logits.shape[0] == len(custom_param_list)
        for i, param_dict in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, param_dict[self.CUSTOM_PARAM_KEY]] = 0.0
        return logits
"""


def deterministic_logit_processor() -> str:
    """SGLang's test processor (every row's logits masked but the given token id's),
    serialised. dill pickles a class by reference to its module, which SGLang's CI server
    can import (it runs in the test's directory) and ours cannot; a class of __main__
    travels by value, so the class is made in a namespace of that name."""
    namespace = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(PROCESSOR_SOURCE, namespace)  # noqa: S102 - the test's own source, above
    return namespace["DeterministicLogitProcessor"]().to_str()


@pytest.fixture(scope="module")
def server(peer_conventions_server):
    return peer_conventions_server


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_reference):
    return tiny_llama_reference.tokenizer


def run_custom_logit_processor(client, tokenizer, target_token_id=None, max_tokens=200):
    """TestOpenAIServerCustomLogitProcessor.run_custom_logit_processor."""
    extra_body = {}
    if target_token_id is not None:
        extra_body["custom_logit_processor"] = deterministic_logit_processor()
        extra_body["custom_params"] = {"token_id": target_token_id}
    model = client.models.list().data[0].id
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Question: Is Paris the Capital of France?"}],
        temperature=0.0,
        max_tokens=max_tokens,
        extra_body=extra_body,
    )
    if target_token_id is not None:
        target_text = tokenizer.decode([target_token_id] * max_tokens)
        assert target_text == response.choices[0].message.content, response.model_dump()


def test_custom_logit_processor(client, tokenizer):
    """TestOpenAIServerCustomLogitProcessor.test_custom_logit_processor."""
    run_custom_logit_processor(client, tokenizer, target_token_id=5)


def test_custom_logit_processor_batch_mixed(client, tokenizer):
    """TestOpenAIServerCustomLogitProcessor.test_custom_logit_processor_batch_mixed: 48
    requests at once, 32 with the processor."""
    # SGLang's ids 0-31 are ordinary characters in Llama-3's vocabulary; the tiny model's
    # low ids include its special tokens (an end-of-turn stops the answer): its first 32
    # ordinary ids instead.
    special = set(tokenizer.all_special_ids)
    ordinary = [t for t in range(len(tokenizer)) if t not in special][:32]
    target_token_ids = ordinary + [None] * 16
    random.shuffle(target_token_ids)
    with ThreadPoolExecutor(len(target_token_ids)) as executor:
        list(executor.map(lambda t: run_custom_logit_processor(client, tokenizer, t),
                          target_token_ids))  # fmt: skip


class PassThrough(CustomLogitProcessor):
    """A processor of this test module (dill pickles it by reference to the module)."""

    def __call__(self, logits, custom_param_list):
        return logits


def test_a_processor_the_server_cannot_load_is_a_400_and_the_server_lives(
    server, client, tokenizer
):
    """Not in SGLang's file: a processor the scheduler could not unpickle (here a class of
    a module the server cannot import) stops SGLang's scheduler and its server; served by
    prefillonly it is a 400 naming the field, and the next request is answered."""
    import requests

    unloadable = PassThrough().to_str()  # by reference to this module: not importable there
    for bad in (unloadable, "not a processor"):
        response = requests.post(
            f"{server.url}/v1/chat/completions",
            json={
                "model": client.models.list().data[0].id,
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
                "custom_logit_processor": bad,
                "custom_params": {"token_id": 5},
            },
            timeout=60,
        )
        assert response.status_code == 400, response.text
        assert "custom_logit_processor" in response.text
    run_custom_logit_processor(client, tokenizer, target_token_id=5)
