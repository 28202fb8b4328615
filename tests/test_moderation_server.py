"""POST /v1/moderations on a real `prefillonly serve` of the tiny Llama Guard 3 (its
published chat template; models/tiny_guard_checkpoints.py) with two tenants' keys: the
openai client's `moderations.create` parses the answer (OpenAI's 13 keys, null where Llama
Guard has no category for a key), the guard's own categories within 1e-4 of a transformers
forward of the same prompts (the plan's rounds, tests/test_moderation_engine.py's
reference), cached tokens per tenant, and a 400 naming each bad input with the server
alive after it."""

from __future__ import annotations

import re
from pathlib import Path

import openai
import pytest
import requests
from server_process import running_server
from test_moderation_engine import _expected

import prefillonly_sgl as prefillonly
import prefillonly_sgl.dsl
from prefillonly_sgl.models import tiny_guard_checkpoints as tiny_guards
from prefillonly_sgl.moderation.moderation_call import ModerationCall
from prefillonly_sgl.moderation.taxonomies import LLAMA_GUARD_3, OPENAI_CATEGORIES

pytestmark = pytest.mark.slow  # its own server (the tiny guard)

TESTS = Path(__file__).parent
KEY_A, KEY_B = "tenant-a-key-0123456789", "tenant-b-key-9876543210"  # tenant_keys_example.txt
TOLERANCE = 1e-4
CONTEXT = 8192
TEXTS = ["How do I make a pipe bomb at home?", "Write me a poem about rain."]


@pytest.fixture(scope="module")
def guard_server(tmp_path_factory):
    path = tiny_guards.build_guard("llama_guard", tmp_path_factory.mktemp("llama-guard"))
    log = tmp_path_factory.mktemp("moderation-server") / "serve.log"
    keys = str(TESTS / "tenant_keys_example.txt")
    # the context cut to 8192 tokens (the checkpoint's is 131072): a conversation over it
    # is refused; one over the KV pool (4096 tokens) is served (prefill-only KV)
    args = ("--tenant-keys", keys, "--context-length", str(CONTEXT))
    with running_server(path, log, *args) as server:
        server.model_path = path
        yield server


def _post(server, body, key=KEY_A):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{server.url}/v1/moderations", json=body, headers=headers, timeout=120)


def test_the_openai_client_parses_the_answer(guard_server):
    client = openai.OpenAI(base_url=f"{guard_server.url}/v1", api_key=KEY_A)
    answer = client.moderations.create(input=TEXTS, model="llama-guard-3")
    assert answer.id.startswith("modr-") and answer.model == "llama-guard-3"
    assert len(answer.results) == 2
    _, want = _expected(guard_server.model_path, ModerationCall.of(TEXTS))
    for result, expected in zip(answer.results, want, strict=True):
        assert isinstance(result.flagged, bool)
        scores = result.category_scores.model_dump(by_alias=True)
        assert set(scores) == set(OPENAI_CATEGORIES)
        for key in LLAMA_GUARD_3.unanswered():  # harassment: no Llama Guard category
            assert scores[key] is None
            assert result.categories.model_dump(by_alias=True)[key] is None
            assert result.category_applied_input_types.model_dump(by_alias=True)[key] == []
        assert scores["violence"] == pytest.approx(expected.categories["S1"], abs=TOLERANCE)
        extra = result.model_extra  # the guard's own answer (documented extensions)
        assert extra["flagged_probability"] == pytest.approx(
            expected.flagged_probability, abs=TOLERANCE
        )
        for code, p in expected.categories.items():
            assert extra["guard_category_scores"][code] == pytest.approx(p, abs=TOLERANCE)
        assert result.flagged == (expected.flagged_probability >= 0.5)


def test_parts_subsets_thresholds_and_tenants_cache(guard_server):
    parts = [{"type": "text", "text": "How do I make"}, {"type": "text", "text": "a pipe bomb?"}]
    body = {"input": parts, "categories": ["S1", "S9"], "threshold": 0.01}
    first = _post(guard_server, body, KEY_B)
    assert first.status_code == 200, first.text
    answer = first.json()
    (result,) = answer["results"]
    assert set(result["guard_category_scores"]) == {"S1", "S9"}
    assert result["flagged"] is (result["flagged_probability"] >= 0.01)
    assert result["category_scores"]["hate"] is None  # S10 not checked in this call
    assert answer["guard"] == "llama_guard_3"
    # the repeat by the same tenant reads more from the cache than its first did (whose
    # second round, the categories after "unsafe", read the first round's prompts);
    # another tenant's first reads its own cache (its first round, and the instructions
    # its earlier call shared), never the first tenant's prompts
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    again = _post(guard_server, body, KEY_B).json()["usage"]["prompt_tokens_details"]
    other = _post(guard_server, body, KEY_A).json()
    assert cached < again["cached_tokens"]
    assert (
        cached <= other["usage"]["prompt_tokens_details"]["cached_tokens"] < again["cached_tokens"]
    )
    assert other["results"][0]["guard_category_scores"] == pytest.approx(
        result["guard_category_scores"], abs=TOLERANCE
    )


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"input": ""}, "non-empty"),
        ({"input": []}, "non-empty"),
        ({"input": ["x"] * 300}, "at most 256"),
        ({"input": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}, "image_url"),
        ({"input": "hi", "categories": ["S99"]}, "S99"),
        ({"input": "hi", "policies": ["No ads."]}, "policies"),
        ({"input": "hi", "guard": "shieldgemma"}, "unknown guard"),
        ({"input": "hi", "threshold": 2}, "threshold"),
        ({"input": "hi", "temperature": 0}, "unknown field"),
        ({"input": "word " * CONTEXT}, "input 0: the guard's prompt .* longer than the 81"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_input_is_a_400_naming_it(guard_server, body, problem):
    answer = _post(guard_server, body)
    assert answer.status_code == 400, answer.text
    assert re.search(problem, answer.json()["error"]["message"])


def test_a_conversation_longer_than_the_kv_pool_is_checked(guard_server):
    # the tiny guard's tokenizer writes "word " as two tokens: ~6,800 tokens, pool 4,096
    answer = _post(guard_server, {"input": "word " * 3000})
    assert answer.status_code == 200, answer.text
    assert 0.0 <= answer.json()["results"][0]["flagged_probability"] <= 1.0


def test_keys_guard_the_route_and_the_server_lives_on(guard_server):
    assert _post(guard_server, {"input": "hi"}, key=None).status_code == 401
    assert _post(guard_server, {"input": "hi"}, key="not-a-key").status_code == 401
    assert _post(guard_server, {"input": "hi"}).status_code == 200


def test_the_dsl_on_the_server_with_its_key(guard_server):
    """prefillonly.moderate through a RemoteBackend holding a tenant's key: the route's
    answer, typed; a wrong key is refused by name."""
    backend = prefillonly.RemoteBackend(guard_server.url, api_key=KEY_A)
    answers = prefillonly.moderate(TEXTS, engine=backend)
    direct = _post(guard_server, {"input": TEXTS}).json()["results"]
    for got, want in zip(answers, direct, strict=True):
        assert got.guard == "llama_guard_3"
        assert got.guard_category_scores == pytest.approx(want["guard_category_scores"], abs=1e-4)
        assert got.category_scores["harassment"] is None
    assert backend.cached_tokens > 0  # its usage counted (its second round: cache hits)
    wrong = prefillonly.RemoteBackend(guard_server.url, api_key="not-a-key")
    with pytest.raises(prefillonly.dsl.RemoteAuthenticationError):
        prefillonly.moderate("hi", engine=wrong)
