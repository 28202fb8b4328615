"""Prefill-only KV: scoring prompts are never chunked, and the off switch gives stock KV.

One engine at a time (SGLang's Engine.shutdown() kills every child process of this
process, other engines' too), on the tiny random Llama in float32."""

from __future__ import annotations

import pytest
from conftest import max_abs_diff
from test_prefill_kv_engine import (
    ITEMS,
    LONG_ITEM,
    LONG_PROMPT_TOLERANCE,
    PROFILE,
    TOLERANCE,
    _cached_tokens,
    _start,
)

from prefillonly_sgl.features.prefill_kv.policy import reusable_prefix_len
from prefillonly_sgl.verification.reference import TransformersReference

pytestmark = pytest.mark.slow  # engines with and without prefill-only KV


@pytest.fixture(scope="module")
def ref_labels(tiny_llama_path):
    ref = TransformersReference(tiny_llama_path)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    return ref, labels


def test_scoring_prompts_are_never_chunked(tiny_llama_path, ref_labels):
    """With 256-token chunks, scoring prompts longer than a chunk still run whole (a later
    chunk would read dropped KV from the pool), each alone in its batch; also longer than
    both the chunk and the pool (stock never runs a forward that long)."""
    ref, labels = ref_labels
    items = [LONG_ITEM[:6000], ITEMS[1], LONG_ITEM[:900] + "?"]
    assert len(ref.prompt_ids(PROFILE, items[0])) > 2 * 1024
    with _start(tiny_llama_path, chunked_prefill_size=256) as engine:
        got = engine.score(PROFILE, items, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, items, labels)) < LONG_PROMPT_TOLERANCE


def test_switch_off_gives_stock_kv(tiny_llama_path, ref_labels):
    ref, labels = ref_labels
    with pytest.raises(ValueError, match="needs prefill_only_attention"):
        _start(tiny_llama_path, prefill_only_attention=False, prefill_only_kv=True)
    with _start(tiny_llama_path, prefill_only_kv=False) as engine:
        assert engine.features == (
            "prefill_attention",
            "jct_scheduler",
            "hybrid_prefill",
            "prompt_logprobs",
        )
        assert engine.limits.scoring_prompt_tokens < 1024  # bounded by the pool again
        assert not engine.prefill_only_kv_active
        got = engine.score(PROFILE, ITEMS, labels).scores
        assert max_abs_diff(got, ref.score(PROFILE, ITEMS, labels)) < TOLERANCE
        prompt = ref.prompt_ids(PROFILE, ITEMS[0])
        reusable = reusable_prefix_len(ref.tokenizer.encode(PROFILE), prompt)
        assert _cached_tokens(engine, prompt, reusable) == len(prompt) - 1  # all cached


def test_unsupported_pool_keeps_stock_kv_and_says_so(tiny_llama_path, ref_labels):
    """A paged KV pool (page size 16) is not handled: the scheduler keeps every request
    stock (and logs why), the Engine warns naming the scheduler's reason (whatever SGLang's
    log level) and validates with the pool-bound limit, and scores stay correct."""
    ref, labels = ref_labels
    with pytest.warns(RuntimeWarning, match=r"prefill-only KV was requested.*\(KV allocator "):
        engine = _start(tiny_llama_path, page_size=16)
    with engine:
        assert not engine.prefill_only_kv_active
        assert engine.limits.scoring_prompt_tokens < 1024
        got = engine.score(PROFILE, ITEMS, labels).scores
        assert max_abs_diff(got, ref.score(PROFILE, ITEMS, labels)) < TOLERANCE
