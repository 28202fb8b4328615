"""Attention in query chunks (a layer run in chunks, features/hybrid_prefill/layer_chunks.py),
on random tensors (no SGLang): every chunk's rows equal a naive full causal attention over each
request's prefix + new tokens (float32, 1e-5), whatever the chunk size: chunks cutting a
long request in several, chunks holding several requests, cached prefixes, GQA. Each chunk
gets its own rows' k / v only: the rows before it are read from the pool (written as
their chunks ran: `run_chunks`, as the backends do) or from the layer's kept keys (rows
whose KV prefill-only KV drops: tests/test_query_chunk_layer_keys.py)."""

from __future__ import annotations

import pytest
import torch
from test_prefill_attention_kernel import expected, make_batch

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges
from prefillonly_sgl.features.prefill_attention.layer_keys import LayerKeys
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk
from prefillonly_sgl.features.prefill_attention.query_chunk import QueryChunkAttention


def _pool_with_own_rows(k_pool, v_pool, spans, kept, order, gen):
    """The pool grown by one slot per row that owns one (NaN until its chunk writes it,
    so a chunk that read a later row would turn NaN); the rows' slots consecutive or
    scattered. Returns (k_pool, v_pool, loc): loc is each row's slot (-1: none)."""
    rows = sum(s.n_new for s in spans)
    owned = [s.q_start + j for s, n in zip(spans, kept) for j in range(n)]
    base = k_pool.shape[0]
    slots = torch.arange(base, base + len(owned))
    if order == "scattered":
        slots = slots[torch.randperm(len(owned), generator=gen)]
    loc = torch.full((rows,), -1, dtype=torch.long)
    loc[torch.tensor(owned, dtype=torch.long)] = slots
    pad = torch.full((len(owned), *k_pool.shape[1:]), float("nan"), dtype=k_pool.dtype)
    return torch.cat([k_pool, pad]), torch.cat([v_pool, pad.clone()]), loc


def run_chunks(batch, chunk, kept, order, attention_of, scale, device="cpu", **kwargs):
    """The batch's rows through a layer's chunks as a backend runs them: each chunk's rows
    that own a slot (the first kept[i] of request i; kept None: all) written to the pool
    first, its other rows kept by LayerKeys, then its attention,
    attention_of(plan, spans, prefix slots, the head's own slots)(q, k, v, k_pool,
    v_pool, scale, earlier=the head's kept keys, **kwargs). Returns every row's output
    on the CPU, float32."""
    spans, slots, q, k, v, k_pool, v_pool = batch
    gen = torch.Generator().manual_seed(1)
    counts = kept if kept is not None else [s.n_new for s in spans]
    k_pool, v_pool, loc = _pool_with_own_rows(k_pool, v_pool, spans, counts, order, gen)
    q, k, v, k_pool, v_pool, loc = (t.to(device) for t in (q, k, v, k_pool, v_pool, loc))
    slots = [None if s is None else s.to(device) for s in slots]
    keys = LayerKeys()
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]))
    for start, end in chunk_ranges(q.shape[0], chunk):
        mine = loc[start:end] >= 0
        k_pool[loc[start:end][mine]] = k[start:end][mine]
        v_pool[loc[start:end][mine]] = v[start:end][mine]
        plan = plan_query_chunk(spans, start, end, counts)
        own = None
        if plan.head is not None and plan.head_kept:
            first = spans[plan.head].q_start
            own = loc[first : first + plan.head_kept]
        earlier = keys.step(plan, spans, counts, k[start:end], v[start:end])
        attention = attention_of(plan, spans, slots, own)
        got = attention(
            q[start:end], k[start:end], v[start:end], k_pool, v_pool, scale,
            earlier=earlier, **kwargs,
        )  # fmt: skip
        out[start:end] = got.float().cpu()
    assert keys.by_request == {}  # each request's kept keys let go of by its last chunk
    return out


def cpu_chunk(plan, spans, slots, own):
    return QueryChunkAttention(plan, spans, slots, own)


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
    """Every row owns a pool slot (prefill-only KV off, or a request it keeps whole)."""
    batch = make_batch(prefix_lens, new_lens, heads=heads)
    want = expected(*batch, 0.3)
    got = run_chunks(batch, chunk, None, "consecutive", cpu_chunk, 0.3)
    assert (got.double() - want).abs().max() < 1e-5


def test_a_chunk_gets_its_own_rows_only():
    """Its queries, keys and values are its rows; the later rows' pool slots hold NaN
    until their chunk runs, so nothing of them is read."""
    batch = make_batch([8, 0], [40, 30])
    want = expected(*batch, 0.25)
    got = run_chunks(batch, 16, [20, 10], "scattered", cpu_chunk, 0.25)
    assert (got.double() - want).abs().max() < 1e-5


def test_a_layers_whole_k_and_v_handed_at_once():
    """The GPU kit's harness keeps its layer's whole K / V (layer_chunks.
    run_layer_in_chunks) and hands them whole, planned without kept counts: the chunk's
    rows and the head's earlier ones come from them (plan.from_whole_kv)."""
    spans, slots, q, k, v, k_pool, v_pool = batch = make_batch([40, 0], [77, 30])
    want = expected(*batch, 0.3)
    got = torch.cat(
        [
            QueryChunkAttention(plan_query_chunk(spans, s, e), spans, slots)(
                q[s:e], k, v, k_pool, v_pool, 0.3
            )
            for s, e in chunk_ranges(q.shape[0], 20)
        ]
    )
    assert (got.double() - want).abs().max() < 1e-5


def test_bfloat16_pool_and_queries():
    batch = make_batch([20], [60], dtype=torch.bfloat16)
    want = expected(*batch, 0.25)
    got = run_chunks(batch, 16, [30], "consecutive", cpu_chunk, 0.25)
    assert (got.double() - want).abs().max() < 2e-2
