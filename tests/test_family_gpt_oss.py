"""gpt-oss through prefillonly_sgl.Engine on CPU, float32, every runtime feature on
(prefill-only attention and KV, the JCT scheduler, hybrid prefilling, prompt logprobs):
the tiny checkpoint of the published shape (models/tiny_family_checkpoints.py: sliding / full layers
with a 16-token window, non-zero attention sinks, 4 experts top-2) scores like a plain
transformers forward within 1e-4, cold and as prefix-cache hits (items behind one shared
query: a shared-prefix group), and its continuation logprobs too. SGLang refuses
torch_native for gpt-oss; the engine starts because sink models are steered to our
backend (features/prefill_attention/sink_models.py). One engine for the module.

Measured here (2-core CPU): cold 1.2e-6, cache hit 1.8e-6, eight items in a shared-prefix
group 3e-8 (whole-vocabulary probabilities), continuation logprobs 5e-6; a reference
without the sinks is 0.057 away. The checkpoint's sinks are bfloat16 values (SGLang keeps
sinks in bfloat16): float32 sinks rounded by SGLang put the engine ~2e-5 away."""

from __future__ import annotations

import os

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine
from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import ATTENTION_LOG
from prefillonly_sgl.models.tiny_family_checkpoints import SLIDING_WINDOW, build_family
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4

QUERY = "User profile: likes science fiction, history books and long walks.\n"
ITEMS = [  # every prompt is longer than the 16-token window; one spans several chunks
    "Item: a documentary about the history of the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction and walks, " * 5 + "Relevant?",
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(build_family("gpt_oss", tmp_path_factory.mktemp("gpt_oss") / "model"))


@pytest.fixture(scope="module")
def plan_log(tmp_path_factory):
    return tmp_path_factory.mktemp("gpt_oss_log") / "plans.jsonl"


@pytest.fixture(scope="module")
def engine(model_path, plan_log):
    # the attention backend's plan per extend batch (read by the spawned scheduler)
    os.environ[ATTENTION_LOG] = str(plan_log)
    try:
        # 32-token chunks: the long item's prefill runs hybrid prefilling's chunks
        engine = Engine(
            model_path, device="cpu", dtype="float32", max_total_tokens=4096,
            hybrid_prefill_chunk_size=32,
        )  # fmt: skip
    finally:
        del os.environ[ATTENTION_LOG]
    with engine:
        yield engine


@pytest.fixture(scope="module")
def reference(model_path):
    return TransformersReference(model_path)


@pytest.fixture(scope="module")
def labels(engine):
    tok = engine.tokenizer
    return [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No", " good")]


def test_every_feature_runs(engine):
    assert set(engine.features) == set(FEATURES)
    assert engine.prefill_only_kv_active


def test_cold_then_cached_match_transformers(engine, reference, labels):
    query = "Cold: " + QUERY  # a query no other test sends: the first call is cold
    want = reference.score(query, ITEMS, labels)
    assert len(reference.prompt_ids(query, ITEMS[1])) > SLIDING_WINDOW
    cold = engine.score(query, ITEMS, labels)
    # cold: the first item computes the query; the others may read it in the same forward
    # (packed behind it, features/prefill_kv/packing.py), never from the cache
    query_tokens = len(reference.tokenizer.encode(query))
    assert cold.cached_tokens <= (len(ITEMS) - 1) * query_tokens
    assert max_abs_diff(cold.scores, want) < TOLERANCE
    hit = engine.score(query, ITEMS, labels)  # the query's KV is in the prefix cache now
    assert hit.cached_tokens > cold.cached_tokens
    assert max_abs_diff(hit.scores, want) < TOLERANCE


def test_items_behind_a_cached_query_match(engine, reference, labels, plan_log):
    """A warm query, then many items in one call: hits on one cached prefix, attended as
    a shared-prefix group (prefix part once, merged by log-sum-exp, then the sinks)."""
    query = "Shared: " + QUERY
    engine.score(query, ITEMS[:1], labels)
    seen = len(read_events(plan_log, "prefill_attention.plan"))
    items = [f"Item {i}: " + "science fiction " * (i % 4) + "Relevant?" for i in range(8)]
    got = engine.score(query, items, labels, apply_softmax=False)
    assert got.cached_tokens >= len(items) * 10
    plans = read_events(plan_log, "prefill_attention.plan")[seen:]
    assert any(len(group) > 1 for plan in plans for group in plan["shared_prefix"])
    want = reference.score(query, items, labels, apply_softmax=False)
    assert max_abs_diff(got.scores, want) < TOLERANCE


def test_sinks_matter(engine, model_path, labels):
    """A reference without the sinks is far from the engine: a backend that dropped them
    would fail the tests above."""
    sinkless = TransformersReference(model_path)
    for name, p in sinkless.model.named_parameters():
        if name.endswith(".sinks"):
            p.data.fill_(float("-inf"))  # e^-inf = 0: no sink in any denominator
    got = engine.score(QUERY, ITEMS, labels)
    assert max_abs_diff(got.scores, sinkless.score(QUERY, ITEMS, labels)) > 1e-3


def test_continuation_logprobs_match(engine, reference):
    continuation = " Yes, it is relevant to the user."
    got = engine.continuation_logprobs(QUERY, ITEMS[:2], continuation)
    want = reference.continuation_logprobs(QUERY, ITEMS[:2], continuation)
    assert max_abs_diff(got.token_logprobs, want) < TOLERANCE


def test_greedy_decode_matches_transformers(engine, model_path):
    """Decode (generate requests only; SGLang's generate on the engine it wraps) runs the
    backend's forward_decode for sink layers: 24 greedy tokens, past the window, equal
    transformers' own."""
    import torch
    from transformers import AutoModelForCausalLM

    ids = engine.tokenizer.encode(QUERY + ITEMS[1], add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    with torch.no_grad():
        want = model.generate(
            torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False
        )[0, len(ids) :].tolist()
    got = engine._sgl.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    )
    assert got["output_ids"] == want
