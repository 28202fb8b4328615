"""A layer run in query chunks without its whole K / V (issue 83, item 6): each chunk's k / v
go to the pool (the rows that own a slot) as the chunk runs, and the layer keeps only the
rows the pool does not hold (those prefill-only KV drops) of a request that continues
past the chunk (prefill_attention/layer_keys.py); later chunks attend to the pool, those
kept keys and their own k / v.

- the plan (plain): the head's earlier new tokens in the pool and kept, what a chunk keeps;
- the CPU kernels and FlashInfer's (its wrappers stood in: tests/flashinfer_standin.py,
  real math) over every chunk of a batch, against a naive attention (float32, 1e-5):
  kept counts from all to none, pool slots consecutive (read in place) and scattered
  (gathered in blocks), chunks across requests, cached prefixes; slots of rows not yet
  written hold NaN, so reading one fails the test;
- both backends' forward_query_chunk on one batch of leaders, followers and lone
  requests (test_one_pass_attention.py's), in chunks, against transformers' attention
  and against the batch in one call (the whole-batch path);
- the memory: a layer's chunked forward (the slot, the CPU backend) allocates less than
  one whole K while it ran with its whole K and V before (torch's allocation records);
- FlashInfer's chunk wrappers get a 256 KiB int workspace instead of FlashInfer's 8 MiB
  (32 of them were 256 MiB of the H200's +506 MiB peak), and FlashInfer's size back if a
  plan overflows it.
"""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import flashinfer_standin
import pytest
import test_one_pass_attention as one  # (SGLang's FlashInfer module: before the stand-in)
import torch
from test_prefill_attention_kernel import expected, make_batch
from test_query_chunk_attention import run_chunks

from prefillonly_sgl.features.hybrid_prefill import layer_chunks
from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges
from prefillonly_sgl.features.prefill_attention import flashinfer_chunk, query_chunk
from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import FlashInferQueryChunk
from prefillonly_sgl.features.prefill_attention.layer_keys import LayerKeys, kept_new_tokens
from prefillonly_sgl.features.prefill_attention.plan import Span, kept_keys, plan_query_chunk
from prefillonly_sgl.features.prefill_attention.query_chunk import (
    QueryChunkAttention,
    pool_reads,
)
from prefillonly_sgl.hooking import process_state

SCALE = 0.3


# -- the plan (plain) ---------------------------------------------------------------------
def test_the_heads_earlier_tokens_are_in_the_pool_up_to_its_kept_ones():
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    kept = [12, 5, 20]
    plan = plan_query_chunk(spans, 20, 50, kept)
    assert (plan.head, plan.head_before, plan.head_kept, plan.head_dropped) == (0, 20, 12, 8)
    plan = plan_query_chunk(spans, 45, 60, kept)  # the third request: all 10 earlier kept
    assert (plan.head, plan.head_before, plan.head_kept, plan.head_dropped) == (2, 10, 10, 0)
    plan = plan_query_chunk(spans, 20, 50)  # no kept counts: the caller hands them all
    assert plan.head_kept == 0 and plan.head_dropped == 20


def test_a_chunk_keeps_the_dropped_rows_of_the_request_that_goes_on():
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    kept = [12, 5, 20]
    # [0, 20): request 0 goes on; its rows from 12 are dropped: rows 12..20, own keys 0..8
    assert kept_keys(spans, kept, 0, 20) == (0, 12, 20, 0)
    assert kept_keys(spans, kept, 20, 29) == (0, 20, 29, 8)
    assert kept_keys(spans, kept, 20, 30) is None  # request 0 ends here
    # [30, 50): request 2 (rows 35..75) goes on, kept up to row 55: nothing dropped yet
    assert kept_keys(spans, kept, 30, 50) is None
    assert kept_keys(spans, kept, 50, 60) == (2, 55, 60, 0)
    assert kept_keys(spans, None, 0, 20) is None


def test_layer_keys_hold_a_request_until_its_last_chunk():
    spans = [Span(0, 0, 40), Span(40, 0, 10)]
    kept = [8, 0]
    k = torch.arange(50.0).view(50, 1, 1)
    keys = LayerKeys()
    got = []
    for start, end in chunk_ranges(50, 16):
        plan = plan_query_chunk(spans, start, end, kept)
        earlier = keys.step(plan, spans, kept, k[start:end], k[start:end])
        got.append(None if earlier is None else earlier[0].flatten().tolist())
        if end == 16:
            # request 0's dropped rows 8..16 kept, room for all 32 of its dropped rows
            assert keys.by_request[0][0].shape[0] == 32
    assert got[0] is None and got[1] == [float(i) for i in range(8, 16)]
    assert got[2] == [float(i) for i in range(8, 32)]  # the chunk [32, 48): request 0's last
    # the chunk [48, 50): request 1 (rows 40..50, none kept) saw its rows 40..48 kept
    assert got[3] == [float(i) for i in range(40, 48)]
    assert keys.by_request == {}  # each let go of with its last chunk


def test_pool_reads_view_runs_and_gather_the_rest():
    slots = torch.tensor([5, 6, 7, 8, 9, 40, 2, 3, 11, 12, 13, 14])
    assert pool_reads(slots, block=4) == [
        ("run", 5, 4),  # a run of 5 slots: a view of 4, then one of 1
        ("run", 9, 1),
        ("gather", 5, 8),  # short runs (40; 2, 3), gathered together: slots[5:8]
        ("run", 11, 4),
    ]


# -- the kernels over every chunk of a batch ------------------------------------------
def _cpu(plan, spans, slots, own):
    return QueryChunkAttention(plan, spans, slots, own)


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())


def _flashinfer(plan, spans, slots, own):
    workspace = torch.empty(8, dtype=torch.uint8)
    return FlashInferQueryChunk(plan, spans, slots, workspace, own_slots=own)


CASES = [
    # (prefix lens, new lens, chunk, kept: a fraction of each request's new tokens)
    ([0], [97], 16, 0.5),  # a cold prompt, half of it reusable: the card's long part
    ([0], [97], 16, 1.0),  # all of it (a loglikelihood request, prefill-only KV off)
    ([0], [97], 16, 0.0),  # none
    ([40], [77], 20, 0.3),  # behind a cached prefix
    ([0, 30, 0, 30], [50, 9, 33, 21], 24, 0.5),  # several requests, chunks across them
    ([12, 12, 0], [5, 70, 3], 16, 0.25),
]


def _kept(new_lens, fraction):
    return None if fraction == 1.0 else [int(n * fraction) for n in new_lens]


@pytest.mark.parametrize("prefix_lens, new_lens, chunk, fraction", CASES)
@pytest.mark.parametrize("order", ["consecutive", "scattered"])
@pytest.mark.parametrize("kernels", ["cpu", "flashinfer"])
def test_chunks_from_the_pool_and_kept_keys_equal_naive_attention(
    prefix_lens, new_lens, chunk, fraction, order, kernels, monkeypatch
):
    if kernels == "flashinfer":
        monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())
    monkeypatch.setattr(query_chunk, "POOL_BLOCK", 8)  # several reads of the pool
    monkeypatch.setattr(query_chunk, "MIN_VIEW", 4)
    batch = make_batch(prefix_lens, new_lens, heads=(6, 2))
    want = expected(*batch, SCALE)
    attention_of = _cpu if kernels == "cpu" else _flashinfer
    got = run_chunks(batch, chunk, _kept(new_lens, fraction), order, attention_of, SCALE)
    assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("window, sinks", [(8, None), (None, True), (8, True)], ids=str)
@pytest.mark.parametrize("kernels", ["cpu", "flashinfer"])
def test_windows_and_sinks_with_kept_keys(window, sinks, kernels, monkeypatch):
    """gpt-oss's sliding windows and sinks over the same three places (the CPU kernels'
    masks by position; FlashInfer's gathered run, through the stand-in of
    test_flashinfer_query_chunk.py), against the naive windowed softmax."""
    from test_attention_sinks_windows import expected as windowed_expected
    from test_attention_sinks_windows import sinks_for
    from test_flashinfer_query_chunk import _RaggedLikeFlashInfer

    monkeypatch.setattr(query_chunk, "POOL_BLOCK", 8)
    monkeypatch.setattr(query_chunk, "MIN_VIEW", 4)
    batch = make_batch([40, 0, 12], [77, 9, 30])
    spans, slots, q, k, v, k_pool, v_pool = batch
    sink_logits = sinks_for(q.shape[1]) if sinks else None
    want = windowed_expected(spans, slots, q, k, v, k_pool, v_pool, window, sink_logits)

    def flashinfer(plan, spans, slots, own):
        return FlashInferQueryChunk(
            plan, spans, slots, torch.empty(0),
            wrappers={("ragged", window): _RaggedLikeFlashInfer()}, own_slots=own,
        )  # fmt: skip

    attention_of = _cpu if kernels == "cpu" else flashinfer
    got = run_chunks(
        batch, 24, [30, 4, 10], "scattered", attention_of, 16**-0.5,
        window=window, sinks=sink_logits,
    )  # fmt: skip
    assert (got.double() - want).abs().max() < 1e-5


def test_a_chunk_refuses_to_run_without_the_kept_keys_it_needs():
    spans, slots, q, k, v, k_pool, v_pool = make_batch([0], [40])
    plan = plan_query_chunk(spans, 16, 32, [8])
    attention = QueryChunkAttention(plan, spans, slots, torch.arange(8))
    with pytest.raises(ValueError, match="8 earlier keys without a pool slot"):
        attention(q[16:32], k[16:32], v[16:32], k_pool, v_pool, SCALE)
    with pytest.raises(RuntimeError, match="were not kept"):
        LayerKeys().step(plan, spans, [8], k[16:32], v[16:32])


# -- both backends on one batch of leaders, followers and lone requests --------------------
def _kept_state(monkeypatch, kept_by_row):
    state = process_state.current()
    monkeypatch.setattr(
        state,
        "prefill_kv",
        dataclasses.replace(state.prefill_kv, active=True, kept=dict(kept_by_row)),
    )


def test_kept_new_tokens_are_read_on_the_host(monkeypatch):
    assert kept_new_tokens([3, 1], [10, 4]) == [10, 4]  # prefill-only KV off: all
    _kept_state(monkeypatch, {3: 6, 1: 4})
    assert kept_new_tokens([3, 1], [10, 4]) == [6, 4]
    with pytest.raises(RuntimeError, match="no kept tokens for request row 2"):
        kept_new_tokens([2], [5])


def _cpu_backend(s, batch):
    """Our CPU backend without SGLang's start-up: the plan, the pool, the device."""
    KV_HEADS = one.KV_HEADS
    from prefillonly_sgl.features.prefill_attention.cpu_extend import ExtendAttention
    from prefillonly_sgl.features.prefill_attention.scheduler_torch_backend import (
        PrefillOnlyTorchBackend,
    )

    class Pool:
        def __init__(self):
            self.k, self.v = s.k_pool.clone(), s.v_pool.clone()

        def set_kv_buffer(self, layer, loc, k, v, *scales):
            self.k[loc.loc] = k.reshape(-1, KV_HEADS, self.k.shape[-1])
            self.v[loc.loc] = v.reshape(-1, KV_HEADS, self.v.shape[-1])

        def get_key_buffer(self, layer_id):
            return self.k

        def get_value_buffer(self, layer_id):
            return self.v

    backend = object.__new__(PrefillOnlyTorchBackend)
    spans, slots, row = [], [], 0
    for i, (p, n, _, _) in enumerate(batch):
        spans.append(Span(row, p, n))
        slots.append(s.table[s.pool_rows[i], :p].long() if p else None)
        row += n
    backend.extend_attention = ExtendAttention(spans, slots)
    backend.token_to_kv_pool = Pool()
    backend.device = "cpu"
    backend._query_chunks = {}
    return backend


@pytest.mark.parametrize("backend_kind", ["cpu", "flashinfer"])
@pytest.mark.parametrize("chunk", [7, 16, 40])
def test_both_backends_in_chunks_equal_transformers_and_the_whole_batch(
    backend_kind, chunk, standin, monkeypatch
):
    """The one-pass test's batch (a prefix group behind a cached prefix, a cold group, a
    follower away from its leader, lone requests; rows past each kept count dropped), its
    layer in chunks of 7, 16 and 40 rows through the backend's forward_query_chunk with
    one LayerKeys, against transformers' attention of each request alone and against the
    batch in one call. The kept rows' slots hold NaN until their chunk writes them."""
    import test_one_pass_attention as one

    s = one._scenario()
    s.pool_rows = one.POOL_ROWS
    kept = s.out_cache_loc != one.DROPPED_SLOT
    s.k_pool[s.out_cache_loc[kept]] = float("nan")
    s.v_pool[s.out_cache_loc[kept]] = float("nan")
    _kept_state(monkeypatch, {one.POOL_ROWS[i]: b[3] for i, b in enumerate(one.BATCH)})
    reference = one._transformers_reference(s)
    layer = one._layer()
    fb = one._forward_batch(s)
    k = s.k.view(s.rows, one.KV_HEADS, one.DIM)
    v = s.v.view(s.rows, one.KV_HEADS, one.DIM)

    def backend():
        if backend_kind == "cpu":
            return _cpu_backend(s, one.BATCH)
        made = one._backend(s, None)
        made._query_chunks, made._chunk_spans, made._chunk_wrappers = {}, None, {}
        return made

    whole = backend().forward_query_chunk(s.q, k, v, layer, fb, 0, s.rows)
    chunked = backend()
    keys = chunked.new_layer_keys()
    got = torch.cat(
        [
            chunked.forward_query_chunk(s.q[a:b], k[a:b], v[a:b], layer, fb, a, b, layer_keys=keys)
            for a, b in chunk_ranges(s.rows, chunk)
        ]
    )
    assert keys.by_request == {}  # every request's kept keys let go of by its last chunk
    assert (whole - reference).abs().max() < 1e-5
    assert (got - reference).abs().max() < 1e-5
    assert (got - whole).abs().max() < 1e-5


# -- the memory ------------------------------------------------------------------------------
def _allocated_peak(fn) -> int:
    """The peak of bytes torch allocated (and had not freed) while fn ran, from the
    profiler's allocation records (CPU: no allocator statistics)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        fn()
    sizes, stack = [], list(p.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            sizes.append((event.start_time_ns, event.extra_fields.alloc_size))
        stack.extend(event.children)
    total = peak = 0
    for _, size in sorted(sizes):
        total += size
        peak = max(peak, total)
    return peak


def _sdpa_attention(q, k_all, v_all, start, end, sinks=None):
    """test_hybrid_layer_chunks.naive_attention for a whole long call, through torch's
    fused kernel (the naive one's logits would be rows x rows)."""
    from test_hybrid_layer_chunks import HEAD_DIM, HEADS, KV_HEADS

    n = end - start
    q = q.view(n, HEADS, HEAD_DIM).transpose(0, 1)
    group = HEADS // KV_HEADS
    k = k_all[:end].repeat_interleave(group, dim=1).transpose(0, 1)
    v = v_all[:end].repeat_interleave(group, dim=1).transpose(0, 1)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(0, 1).reshape(n, HEADS * HEAD_DIM)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_a_chunked_layer_allocates_less_than_its_whole_k_and_v(fraction, monkeypatch):
    """One decoder layer of 16,384 rows in 256-row chunks, as hybrid prefilling runs it
    (the slot, run_slices, the CPU backend's forward_query_chunk, its LayerKeys): what
    it allocates peaks below 3/4 of one whole K when every row owns a pool slot, and
    below that plus the dropped half's K and V when half of them do: the slot's whole K
    and V (twice one K: what ran before) no longer exist. Its values are the whole
    layer's."""
    import test_hybrid_layer_chunks as plain

    from prefillonly_sgl.features.prefill_attention.cpu_extend import ExtendAttention
    from prefillonly_sgl.features.prefill_attention.scheduler_torch_backend import (
        PrefillOnlyTorchBackend,
    )

    rows, chunk, kv, dim = 16384, 256, plain.KV_HEADS, plain.HEAD_DIM
    torch.manual_seed(0)
    layer = plain.PlainLayer()
    attn = layer.self_attn.attn
    attn.sliding_window_size = -1
    n_kept = int(rows * fraction)
    pool_k, pool_v = torch.zeros(n_kept + 1, kv, dim), torch.zeros(n_kept + 1, kv, dim)

    class Pool:
        def set_kv_buffer(self, layer, loc, k, v, *scales):
            pool_k[loc.loc], pool_v[loc.loc] = k, v

        def get_key_buffer(self, layer_id):
            return pool_k

        def get_value_buffer(self, layer_id):
            return pool_v

    backend = object.__new__(PrefillOnlyTorchBackend)
    backend.extend_attention = ExtendAttention([Span(0, 0, rows)], [None])
    backend.token_to_kv_pool, backend.device, backend._query_chunks = Pool(), "cpu", {}
    loc = torch.zeros(rows, dtype=torch.long)
    loc[:n_kept] = torch.arange(1, n_kept + 1)
    batch = SimpleNamespace(out_cache_loc=loc, req_pool_indices=torch.tensor([0]))
    _kept_state(monkeypatch, {0: n_kept})
    x, positions = torch.randn(rows, plain.HIDDEN), torch.arange(rows)
    with torch.no_grad():
        monkeypatch.setattr(plain, "naive_attention", _sdpa_attention)
        want = layer(positions, x.clone(), None)  # the whole layer, before the redirect
        plan = layer_chunks.plan_layer(layer)
        slot = layer_chunks.QueryChunkSlot()
        layer_chunks.redirect_attention(plan.attention, slot)
        keys = backend.new_layer_keys()

        def attend(q, k, v, start, end, sinks=None):
            return backend.forward_query_chunk(
                q, k, v, attn, batch, start, end, sinks=sinks, layer_keys=keys
            )

        stream = x.clone()

        def chunked():
            bound = plan.signature.bind(positions, stream, None)
            slicer = layer_chunks.CallSlicer(bound, rows, ("hidden_states", "forward_batch"))
            stream_rows = layer_chunks.PlainStream(stream)
            layer_chunks.run_slices(layer.forward, slicer, stream_rows, slot, chunk, attend)

        peak = _allocated_peak(chunked)
    torch.testing.assert_close(stream, want, rtol=0, atol=1e-5)
    one_k = rows * kv * dim * 4
    dropped = 2 * (rows - n_kept) * kv * dim * 4  # the dropped rows' K and V, kept
    assert peak < 0.75 * one_k + dropped, (peak, one_k, dropped)


# -- FlashInfer's int workspaces ---------------------------------------------------------
class _Wrapper:
    """A FlashInfer wrapper as the chunk uses it: FlashInfer's 8 MiB int workspace at
    construction, reset_workspace_buffer, a plan that needs `needs` bytes of it."""

    needs = 4096

    def __init__(self, workspace, layout, backend=None):
        self.int_bytes = 8 << 20
        self.resets = []

    def reset_workspace_buffer(self, float_workspace, int_workspace):
        self.int_bytes = int(int_workspace.numel())
        self.resets.append(self.int_bytes)

    def plan(self, *args, **kwargs):
        if self.needs > self.int_bytes:
            raise RuntimeError("Buffer overflow when allocating memory for batch_prefill_tmp_v")

    def run(self, q, k, v=None, return_lse=False):
        return torch.zeros_like(q), torch.zeros(q.shape[:2])


def test_chunk_wrappers_get_a_small_int_workspace_and_flashinfers_back_on_overflow(
    monkeypatch,
):
    fake = SimpleNamespace(
        BatchPrefillWithRaggedKVCacheWrapper=_Wrapper,
        BatchPrefillWithPagedKVCacheWrapper=_Wrapper,
        merge_state=lambda o, lse, o2, lse2: (o, lse),
    )
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    spans = [Span(0, 10, 40)]
    plan = plan_query_chunk(spans, 20, 40, [30])
    wrappers = {}
    chunk = FlashInferQueryChunk(
        plan, spans, [torch.arange(10)], torch.empty(8, dtype=torch.uint8), wrappers,
        own_slots=torch.arange(20, 40),
    )  # fmt: skip
    q, k = torch.zeros(20, 4, 16), torch.zeros(20, 2, 16)
    chunk(q, k, k, torch.zeros(64, 2, 16), torch.zeros(64, 2, 16), 0.25)
    assert sorted(wrappers) == ["paged", "ragged"]
    small = flashinfer_chunk.INT_WORKSPACE_BYTES
    assert small == 256 << 10 and all(w.resets == [small] for w in wrappers.values())
    monkeypatch.setattr(_Wrapper, "needs", 2 << 20)  # a plan past 256 KiB
    spans = [Span(0, 0, 40)]
    wrappers = {}
    chunk = FlashInferQueryChunk(
        plan_query_chunk(spans, 0, 20), spans, [None], torch.empty(8), wrappers
    )
    chunk(q, k, k, torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), 0.25)
    assert wrappers["ragged"].resets == [small, flashinfer_chunk.FLASHINFER_INT_WORKSPACE_BYTES]
    monkeypatch.setattr(_Wrapper, "needs", 16 << 20)  # past FlashInfer's own: the error
    with pytest.raises(RuntimeError, match="Buffer overflow"):
        FlashInferQueryChunk(plan_query_chunk(spans, 0, 20), spans, [None], torch.empty(8), {})(
            q, k, k, torch.zeros(1, 2, 16), torch.zeros(1, 2, 16), 0.25
        )
