"""Attention in query chunks (a layer run in chunks, features/hybrid_prefill/layer_chunks.py),
on random tensors (no SGLang): every chunk's rows equal a naive full causal attention over each
request's prefix + new tokens (float32, 1e-5), whatever the chunk size: chunks cutting a
long request in several, chunks holding several requests, cached prefixes, GQA."""

from __future__ import annotations

import pytest
import torch
from test_prefill_attention_kernel import expected, make_batch

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk
from prefillonly_sgl.features.prefill_attention.query_chunk import QueryChunkAttention


def test_the_plan_splits_a_chunk_by_request():
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    plan = plan_query_chunk(spans, 20, 50)
    assert (plan.head, plan.head_before, plan.head_rows) == (0, 20, 10)
    assert plan.rest == ((1, Span(10, 0, 5)), (2, Span(15, 7, 15)))
    plan = plan_query_chunk(spans, 30, 35)  # starts at a request: no head
    assert plan.head is None and plan.rest == ((1, Span(0, 0, 5)),)
    plan = plan_query_chunk(spans, 40, 75)  # inside one request
    assert (plan.head, plan.head_before, plan.head_rows, plan.rest) == (2, 5, 35, ())
    with pytest.raises(ValueError, match="empty"):
        plan_query_chunk(spans, 5, 5)


@pytest.mark.parametrize(
    "prefix_lens, new_lens, chunk",
    [
        ([0], [97], 16),  # a cold prompt in 7 chunks, the last one short
        ([0], [96], 32),  # a multiple of the chunk
        ([40], [77], 20),  # behind a cached prefix
        ([0, 30, 0, 30], [50, 9, 33, 21], 24),  # several requests, chunks across them
        ([12, 12, 0], [5, 70, 3], 64),  # a short one, a long one, a tail
        ([0], [10], 64),  # one chunk only
    ],
)
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)], ids=["gqa", "mha"])
def test_chunks_equal_naive_attention(prefix_lens, new_lens, chunk, heads):
    spans, slots, q, k, v, k_pool, v_pool = make_batch(prefix_lens, new_lens, heads=heads)
    scale = 0.3
    want = expected(spans, slots, q, k, v, k_pool, v_pool, scale)
    got = torch.empty_like(want, dtype=q.dtype)
    for start, end in chunk_ranges(q.shape[0], chunk):
        attention = QueryChunkAttention(plan_query_chunk(spans, start, end), spans, slots)
        got[start:end] = attention(q[start:end], k, v, k_pool, v_pool, scale)
    assert (got.double() - want).abs().max() < 1e-5


def test_later_rows_are_not_read():
    """A chunk never reads keys / values of rows after it (the layer has not computed
    them yet): NaN there changes nothing."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch([8, 0], [40, 30])
    want = expected(spans, slots, q, k, v, k_pool, v_pool, 0.25)
    for start, end in chunk_ranges(q.shape[0], 16):
        k_now, v_now = k.clone(), v.clone()
        k_now[end:], v_now[end:] = float("nan"), float("nan")
        attention = QueryChunkAttention(plan_query_chunk(spans, start, end), spans, slots)
        got = attention(q[start:end], k_now, v_now, k_pool, v_pool, 0.25)
        assert (got.double() - want[start:end]).abs().max() < 1e-5


def test_bfloat16_pool_and_queries():
    spans, slots, q, k, v, k_pool, v_pool = make_batch([20], [60], dtype=torch.bfloat16)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, 0.25)
    got = torch.cat(
        [
            QueryChunkAttention(plan_query_chunk(spans, s, e), spans, slots)(
                q[s:e], k, v, k_pool, v_pool, 0.25
            )
            for s, e in chunk_ranges(60, 16)
        ]
    )
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max() < 2e-2
