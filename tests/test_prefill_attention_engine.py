"""The prefill-only attention backend inside a running engine (tiny random Llama,
float32): probabilities equal a transformers forward (1e-4) for cold requests, prefix
cache hits, items of different lengths and mixed batches, and the backend's plan log
shows that the hits really skipped the cached prefix. With prefill_only_attention=False
the engine runs stock SGLang attention (the log stays empty)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import STOCK_SGLANG, Engine
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import ATTENTION_LOG as LOG_ENV
from prefillonly_sgl.machine.environment import FORWARD_PROFILE as PROFILE_ENV
from prefillonly_sgl.verification.reference import TransformersReference

pytestmark = pytest.mark.slow  # engines with and without the attention backend

TOLERANCE = 1e-4

PROFILE = "User profile: likes science fiction, history books and long walks. " * 6 + "\n"
ITEMS = [
    "Item: a documentary about the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction and walks, " * 25 + "Relevant?",
]
OTHER_ITEMS = ["Item: a telescope. Relevant?", "Item: " + "history, " * 40 + "Relevant?"]


def _start(path, log_path, **kwargs):
    os.environ[LOG_ENV] = str(log_path)  # read by the spawned scheduler at each batch
    try:
        return Engine(path, device="cpu", dtype="float32", max_total_tokens=8192, **kwargs)
    finally:
        del os.environ[LOG_ENV]


@pytest.fixture(scope="module")
def setup(tiny_llama_path, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("attention-log") / "plan.log"
    # the forward-profile instrument rides along (benchmarks/forward_profile.py's engines)
    os.environ[PROFILE_ENV] = str(log_path.with_name("forward-profile.jsonl"))
    try:
        engine = _start(tiny_llama_path, log_path)
    finally:
        del os.environ[PROFILE_ENV]
    ref = TransformersReference(tiny_llama_path)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    yield engine, ref, labels, log_path
    engine.shutdown()


def _new_plans(log_path, seen: list) -> list[dict]:
    """The attention plans logged since the last call (structured events)."""
    plans = read_events(log_path, "prefill_attention.plan")
    new = plans[len(seen) :]
    seen[:] = plans
    return new


def test_backend_is_active_and_cold_items_match(setup):
    engine, ref, labels, log_path = setup
    assert engine.features == (
        "prefill_attention",
        "prefill_kv",
        "jct_scheduler",
        "hybrid_prefill",
        "prompt_logprobs",
    )
    got = engine.score(PROFILE, ITEMS, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, ITEMS, labels)) < TOLERANCE
    assert read_events(log_path, "prefill_attention.plan")


def test_cache_hit_computes_only_the_item_and_matches(setup):
    engine, ref, labels, log_path = setup
    engine.score(PROFILE, ITEMS[:1], labels)  # the profile is now in the radix cache
    seen: list = []
    _new_plans(log_path, seen)
    got = engine.score(PROFILE, OTHER_ITEMS, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, OTHER_ITEMS, labels)) < TOLERANCE
    plans = _new_plans(log_path, seen)
    profile_tokens = len(ref.tokenizer.encode(PROFILE))
    assert plans, "no extend batch was logged"
    prefixes = [prefix for plan in plans for prefix, _ in plan["spans"]]
    assert len(prefixes) == len(OTHER_ITEMS), plans
    assert min(prefixes) >= profile_tokens - 2, plans  # the profile was not recomputed


def test_hits_behind_one_prefix_share_its_attention_and_match(setup):
    """Items behind the cached profile run as one batch whose attention to the profile is
    one shared-prefix group (plan log), and still equal transformers (1e-4)."""
    engine, ref, labels, log_path = setup
    engine.score(PROFILE, ITEMS[:1], labels)  # cached
    seen: list = []
    _new_plans(log_path, seen)
    items = [f"Item: gadget number {i}. Relevant?" for i in range(4)] + OTHER_ITEMS
    got = engine.score(PROFILE, items, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, items, labels)) < TOLERANCE
    plans = _new_plans(log_path, seen)
    shared = [plan["shared_prefix"] for plan in plans]
    assert any(groups and len(groups[0]) >= 2 for groups in shared), plans


def test_forward_profile_records_each_extend_batch(setup):
    """The instrument's line per extend batch: the requests' prefix / new tokens, and
    seconds of the step, the forward and the module kinds inside it (which cannot add up
    to more than the forward)."""
    engine, ref, labels, log_path = setup
    profile = log_path.with_name("forward-profile.jsonl")
    before = len(profile.read_text().splitlines()) if profile.exists() else 0
    engine.score(PROFILE, ITEMS[:2], labels)
    records = [json.loads(line) for line in profile.read_text().splitlines()[before:]]
    assert records, "no extend batch was profiled"
    assert sum(len(r["new"]) for r in records) == 2
    for r in records:
        assert len(r["prefix"]) == len(r["new"]) and min(r["new"]) > 0
        assert 0 < r["forward_s"] <= r["step_s"]
        assert {"linear", "attention", "norm"} <= set(r["modules_s"])
        assert sum(r["modules_s"].values()) <= r["forward_s"]


def test_same_request_twice_is_identical(setup):
    engine, _, labels, _ = setup
    first = engine.score(PROFILE, ITEMS, labels).scores
    again = engine.score(PROFILE, ITEMS, labels).scores
    assert max_abs_diff(first, again) < 1e-6


def test_mixed_batch_of_cold_and_cached_requests(setup):
    """Several score calls in flight at once: SGLang batches them into one prefill with
    cached and cold requests of different lengths."""
    engine, ref, labels, _ = setup
    queries = [PROFILE, "A different, never seen query about cooking.\n", PROFILE[:150]]
    items = [ITEMS, OTHER_ITEMS, ITEMS[1:]]
    sgl = engine._sgl

    async def all_at_once():
        return await asyncio.gather(
            *(engine.async_score(q, i, labels) for q, i in zip(queries, items))
        )

    results = sgl.loop.run_until_complete(all_at_once())
    for query, its, result in zip(queries, items, results):
        assert max_abs_diff(result.scores, ref.score(query, its, labels)) < TOLERANCE


def test_token_ids_and_whole_vocabulary_probabilities(setup):
    engine, ref, labels, _ = setup
    query_ids = ref.tokenizer.encode(PROFILE)
    item_ids = [ref.tokenizer.encode(item, add_special_tokens=False) for item in ITEMS]
    got = engine.score(query_ids, item_ids, labels, apply_softmax=False).scores
    want = ref.score(query_ids, item_ids, labels, apply_softmax=False)
    assert max_abs_diff(got, want) < TOLERANCE


def test_switch_off_gives_stock_attention(tiny_llama_path, tmp_path, setup):
    _, ref, labels, _ = setup
    log_path = tmp_path / "stock.log"
    with _start(tiny_llama_path, log_path, **STOCK_SGLANG) as stock:
        assert stock.features == ()
        got = stock.score(PROFILE, ITEMS, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, ITEMS, labels)) < TOLERANCE
    assert not log_path.exists()  # our backend never ran


def test_chunked_prefill_reads_earlier_chunks_from_the_pool(tiny_llama_path, tmp_path, setup):
    """With 64-token chunks a long prompt's later chunks attend to earlier chunks' KV in
    the pool, the same path as a cache hit inside one request. (Prefill-only KV never
    chunks scoring prompts, so it is off here.)"""
    _, ref, labels, _ = setup
    log_path = tmp_path / "chunked.log"
    with _start(
        tiny_llama_path, log_path, chunked_prefill_size=64, prefill_only_kv=False
    ) as engine:
        got = engine.score(PROFILE, ITEMS, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, ITEMS, labels)) < TOLERANCE
    spans = [
        span for plan in read_events(log_path, "prefill_attention.plan") for span in plan["spans"]
    ]
    assert any(p > 0 and n > 1 for p, n in spans), spans  # a chunk behind earlier chunks
