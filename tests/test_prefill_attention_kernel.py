"""The prefill-only attention kernel and its planner, on random tensors (no SGLang):
outputs equal a naive full causal attention over prefix + new tokens (float32, 1e-5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from prefillonly_sgl.features.prefill_attention.cpu_extend import ExtendAttention, tail_mask
from prefillonly_sgl.features.prefill_attention.plan import (
    Limits,
    MaskKind,
    Span,
    plan_groups,
    plan_query_blocks,
    plan_shared_prefix,
)

H, HKV, D = 6, 2, 16


def naive_attention(q_new, k_all, v_all, scale):
    """Full causal attention over prefix + new; rows of the new tokens. float64."""
    n_new, kv_len = q_new.shape[0], k_all.shape[0]
    group = q_new.shape[1] // k_all.shape[1]
    k = k_all.double().repeat_interleave(group, dim=1)  # (S, H, D)
    v = v_all.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q_new.double(), k) * scale
    q_pos = torch.arange(kv_len - n_new, kv_len).unsqueeze(1)
    visible = torch.arange(kv_len).unsqueeze(0) <= q_pos
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def make_batch(prefix_lens, new_lens, seed=0, dtype=torch.float32, pool_size=None, heads=(H, HKV)):
    """Random pool with each request's prefix at scattered slots, and new q/k/v."""
    n_heads, n_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    pool_size = pool_size or (sum(prefix_lens) * 2 + 8)
    k_pool = torch.randn(pool_size, n_kv_heads, D, generator=gen, dtype=dtype)
    v_pool = torch.randn(pool_size, n_kv_heads, D, generator=gen, dtype=dtype)
    free = torch.randperm(pool_size, generator=gen)
    spans, slots, start, used = [], [], 0, 0
    for p, n in zip(prefix_lens, new_lens):
        spans.append(Span(start, p, n))
        slots.append(free[used : used + p] if p else None)
        used += p
        start += n
    total = sum(new_lens)
    q = torch.randn(total, n_heads, D, generator=gen, dtype=dtype)
    k = torch.randn(total, n_kv_heads, D, generator=gen, dtype=dtype)
    v = torch.randn(total, n_kv_heads, D, generator=gen, dtype=dtype)
    return spans, slots, q, k, v, k_pool, v_pool


def expected(spans, slots, q, k, v, k_pool, v_pool, scale):
    rows = []
    for span, s in zip(spans, slots):
        new = slice(span.q_start, span.q_start + span.n_new)
        k_all, v_all = k[new], v[new]
        if span.prefix_len:
            k_all = torch.cat([k_pool[s], k_all])
            v_all = torch.cat([v_pool[s], v_all])
        rows.append(naive_attention(q[new], k_all, v_all, scale))
    return torch.cat(rows)


SMALL_BLOCKS = Limits(max_block_mask=64 * 8, min_block=8, small_work=0)  # force blocks
NO_GROUPS = Limits(small_work=0)
GROUPS = Limits(small_work=1 << 20, max_padding=10.0)


@pytest.mark.parametrize(
    "prefix_lens, new_lens",
    [
        ([0], [37]),  # cold
        ([50], [20]),  # cache hit
        ([50], [1]),  # one new token
        ([0, 30, 64, 5], [17, 9, 33, 1]),  # mixed batch
        ([100, 100, 100], [12, 30, 7]),  # items behind one shared-length prefix
    ],
)
@pytest.mark.parametrize("stack", [True, False], ids=["stacked", "gqa"])
@pytest.mark.parametrize("limits", [Limits(), NO_GROUPS, SMALL_BLOCKS, GROUPS], ids=str)
def test_matches_naive_attention(prefix_lens, new_lens, limits, stack):
    limits = dataclasses.replace(limits, stack_heads_below=1 << 30 if stack else 0)
    spans, slots, q, k, v, k_pool, v_pool = make_batch(prefix_lens, new_lens)
    scale = D**-0.5
    out = torch.full_like(q, float("nan"))
    ExtendAttention(spans, slots, limits=limits)(q, k, v, k_pool, v_pool, scale, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, scale)
    assert (out.double() - want).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "prefix_lens, new_lens, single",
    [
        ([0], [300], True),  # a cold prompt: one causal call
        ([50], [900], True),  # a long item behind a prefix: one masked call (not stacked)
        ([50], [12], False),  # a short item: stacked heads, written into a buffer
        ([0, 30], [40, 8], False),  # two requests
    ],
)
def test_without_out_one_call_returns_the_kernels_own_output(prefix_lens, new_lens, single):
    """Without `out`, one SDPA call's output is returned as it is (no second buffer);
    values are those written into an `out` buffer."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch(prefix_lens, new_lens)
    attention = ExtendAttention(spans, slots)
    got = attention(q, k, v, k_pool, v_pool, None)
    assert got.shape == q.shape[:2] + (v.shape[2],) and got.is_contiguous()
    assert (attention._single_call() is not None) == single
    want = expected(spans, slots, q, k, v, k_pool, v_pool, D**-0.5)
    assert (got.double() - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("limits", [Limits(), NO_GROUPS, SMALL_BLOCKS, GROUPS], ids=str)
def test_multi_head_attention_without_grouped_heads(limits):
    spans, slots, q, k, v, k_pool, v_pool = make_batch([0, 40, 9], [30, 12, 5], heads=(4, 4))
    out = torch.empty_like(q)
    ExtendAttention(spans, slots, limits=limits)(q, k, v, k_pool, v_pool, 0.3, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, 0.3)
    assert (out.double() - want).abs().max().item() < 1e-5


def test_reused_across_layers_and_bf16_pool_cast():
    """One plan serves several layers; a pool in another dtype is cast to q's dtype."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch([40, 0, 8], [10, 20, 3], seed=3)
    attention = ExtendAttention(spans, slots, limits=GROUPS)
    for layer in range(3):
        q_l, k_l, v_l = q * (layer + 1), k - layer, v + layer
        out = torch.empty_like(q)
        attention(q_l, k_l, v_l, k_pool.bfloat16(), v_pool.bfloat16(), None, out)
        want = expected(
            spans,
            slots,
            q_l,
            k_l,
            v_l,
            k_pool.bfloat16().float(),
            v_pool.bfloat16().float(),
            D**-0.5,
        )
        assert (out.double() - want).abs().max().item() < 1e-5


def test_tail_mask():
    mask = tail_mask(3, 5, torch.float32, "cpu")
    visible = (mask == 0).int().tolist()
    assert visible == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_plan_query_blocks():
    assert plan_query_blocks(0, 5000) == [plan_query_blocks(0, 5000)[0]]
    assert plan_query_blocks(0, 5000)[0].mask is MaskKind.CAUSAL  # cold: no mask at all
    assert plan_query_blocks(700, 1)[0].mask is MaskKind.NONE
    assert plan_query_blocks(7, 0) == []
    limits = Limits(max_block_mask=1000, min_block=4)
    blocks = plan_query_blocks(90, 30, limits)  # kv 120 -> blocks of 8 queries
    assert [(b.q_start, b.q_end, b.kv_end) for b in blocks][:2] == [(0, 8, 98), (8, 16, 106)]
    assert blocks[-1].q_end == 30 and blocks[-1].kv_end == 120
    assert all(b.mask is MaskKind.TAIL for b in blocks)
    assert all(b.q_end - b.q_start <= 8 for b in blocks)


def test_plan_groups_packs_similar_small_requests():
    spans = [Span(0, 1000, 100), Span(100, 1000, 90), Span(190, 0, 5000), Span(5190, 20, 3)]
    alone, groups = plan_groups(spans, Limits(small_work=1 << 18))
    assert alone == [2, 3]  # too big to batch; and a request left on its own
    assert [g.members for g in groups] == [(0, 1)]
    assert groups[0].n_max == 100 and groups[0].kv_max == 1100


def test_plan_groups_respects_padding_limit():
    spans = [Span(0, 4000, 100), Span(100, 10, 5)]  # very different: padding would dominate
    alone, groups = plan_groups(spans, Limits(small_work=1 << 20))
    assert alone == [0, 1] and groups == []


@pytest.mark.parametrize("limits", [Limits(), NO_GROUPS, SMALL_BLOCKS, GROUPS], ids=str)
def test_bfloat16(limits):
    """The dtype the benchmarks run: same plans, bf16 kernels (looser tolerance)."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch(
        [0, 70, 300], [40, 25, 1], seed=5, dtype=torch.bfloat16
    )
    out = torch.empty_like(q)
    ExtendAttention(spans, slots, limits=limits)(q, k, v, k_pool, v_pool, None, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, D**-0.5)
    assert (out.double() - want).abs().max().item() < 2e-2


def make_shared_batch(shared_prefix, new_lens, others=(), seed=7, dtype=torch.float32):
    """Requests whose cached prefixes are the SAME pool slots (hits on one prefix, as the
    radix cache hands them out), then `others` (prefix_len, n_new) with their own."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch(
        [shared_prefix] + [p for p, _ in others],
        [new_lens[0]] + [n for _, n in others],
        seed=seed,
        dtype=dtype,
    )
    gen = torch.Generator().manual_seed(seed + 1)
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    extra = sum(new_lens[1:])
    q = torch.cat(
        [
            q[: new_lens[0]],
            torch.randn(extra, n_heads, D, generator=gen, dtype=dtype),
            q[new_lens[0] :],
        ]
    )
    k = torch.cat(
        [
            k[: new_lens[0]],
            torch.randn(extra, n_kv_heads, D, generator=gen, dtype=dtype),
            k[new_lens[0] :],
        ]
    )
    v = torch.cat(
        [
            v[: new_lens[0]],
            torch.randn(extra, n_kv_heads, D, generator=gen, dtype=dtype),
            v[new_lens[0] :],
        ]
    )
    shared_spans, start = [], 0
    for n in new_lens:
        shared_spans.append(Span(start, shared_prefix, n))
        start += n
    other_spans = [Span(start + s.q_start - new_lens[0], s.prefix_len, s.n_new) for s in spans[1:]]
    return (
        shared_spans + other_spans,
        [slots[0]] * len(new_lens) + slots[1:],
        q,
        k,
        v,
        k_pool,
        v_pool,
    )


@pytest.mark.parametrize(
    "new_lens, others",
    [
        ([20, 20, 20, 20], []),  # k equal items behind one prefix: dense own part
        ([30, 7, 1, 25, 64], []),  # items of different lengths: padded own runs
        ([12, 40], [(0, 33), (25, 9)]),  # a shared group beside a cold request and another hit
        ([1, 1, 1], []),  # one new token each
    ],
)
@pytest.mark.parametrize("limits", [Limits(), GROUPS], ids=str)
def test_shared_prefix_group_matches_naive_attention(new_lens, others, limits):
    spans, slots, q, k, v, k_pool, v_pool = make_shared_batch(60, new_lens, others)
    attention = ExtendAttention(spans, slots, limits=limits)
    assert [sorted(g.group.members) for g in attention.shared] == [list(range(len(new_lens)))]
    out = torch.full_like(q, float("nan"))
    attention(q, k, v, k_pool, v_pool, D**-0.5, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, D**-0.5)
    assert (out.double() - want).abs().max().item() < 1e-5
    got = attention(q, k, v, k_pool, v_pool, None)  # without `out` too
    assert (got.double() - want).abs().max().item() < 1e-5


def test_shared_prefix_group_out_of_order_rows_and_bf16_pool():
    """Members not adjacent in the batch (another request between them), a bf16 pool."""
    spans, slots, q, k, v, k_pool, v_pool = make_shared_batch(50, [10, 14], [(30, 6)])
    spans = [spans[0], Span(10, 30, 6), Span(16, 50, 14)]  # shared, other, shared
    slots = [slots[0], slots[2], slots[0]]
    attention = ExtendAttention(spans, slots)
    assert [g.group.members for g in attention.shared] == [(0, 2)]
    assert not attention.shared[0].contiguous
    out = torch.empty_like(q)
    attention(q, k, v, k_pool.bfloat16(), v_pool.bfloat16(), None, out)
    want = expected(
        spans, slots, q, k, v, k_pool.bfloat16().float(), v_pool.bfloat16().float(), D**-0.5
    )
    assert (out.double() - want).abs().max().item() < 1e-5


def test_equal_prefix_lengths_in_different_slots_are_not_shared():
    """Two hits of the same length on different prefixes (other users) stay apart."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch([40, 40], [10, 10])
    attention = ExtendAttention(spans, slots)
    assert attention.shared == []
    out = torch.empty_like(q)
    attention(q, k, v, k_pool, v_pool, None, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, D**-0.5)
    assert (out.double() - want).abs().max().item() < 1e-5


def test_plan_shared_prefix_runs():
    news = [300, 290, 10, 10, 10, 10]
    spans, start = [], 0
    for n in news:
        spans.append(Span(start, 100, n))
        start += n
    spans.append(Span(start, 0, 9))
    limits = Limits(padding_slack=1000)
    rest, groups = plan_shared_prefix(spans, ["u1"] * len(news) + [None], limits)
    assert rest == [len(news)]
    (group,) = groups
    assert group.prefix_len == 100 and sorted(group.members) == list(range(len(news)))
    assert sorted(i for run in group.own_runs for i in run) == list(range(len(news)))
    assert len(group.own_runs) == 2  # the short items do not all pad to 300
    for run in group.own_runs:  # padding at most doubles a run's causal area
        padded = len(run) * max(news[i] for i in run) ** 2
        assert padded <= 2 * sum(news[i] ** 2 for i in run)
    assert plan_shared_prefix(spans[:3], ["a", "b", "c"]) == ([0, 1, 2], [])


def test_bfloat16_shared_prefix():
    spans, slots, q, k, v, k_pool, v_pool = make_shared_batch(80, [25, 25, 9], dtype=torch.bfloat16)
    out = torch.empty_like(q)
    ExtendAttention(spans, slots)(q, k, v, k_pool, v_pool, None, out)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, D**-0.5)
    assert (out.double() - want).abs().max().item() < 2e-2
