"""FlashInfer's query-chunk attention (CUDA path of layers run in query chunks): its plan on
CPU (which rows are queries and keys of which request: plain Python), its values against a
naive attention wherever CUDA and flashinfer are present (skipped on the CPU machines)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
from test_prefill_attention_kernel import expected, make_batch
from test_query_chunk_attention import run_chunks

from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import (
    FlashInferQueryChunk,
    chunk_pieces,
    windowed_keys,
)
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk


def test_pieces_and_indptrs_of_a_chunk():
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    plan = plan_query_chunk(spans, 20, 50, kept=[12, 5, 40])
    # head: queries 0..10 of the chunk; then the two that begin in it; each piece's own
    # keys in the chunk are its rows
    assert chunk_pieces(plan, spans) == [(0, 0, 10), (1, 10, 5), (2, 15, 15)]
    slots = [torch.arange(10), None, torch.arange(100, 107)]
    own = torch.arange(50, 62)  # the head's 12 earlier rows with a slot (8 more kept by the layer)
    chunk = FlashInferQueryChunk(plan, spans, slots, torch.empty(0), own_slots=own)
    assert chunk.qo_indptr.tolist() == [0, 10, 15, 30]
    assert chunk.kv_indptr.tolist() == [0, 10, 15, 30]
    indptr, indices, last_page = chunk.paged
    assert indptr.tolist() == [0, 22, 22, 29]  # the head: prefix 10 + own 12
    assert indices.tolist() == list(range(10)) + list(range(50, 62)) + list(range(100, 107))
    qo, kv = chunk.earlier  # the head's queries against its 8 kept keys
    assert qo.tolist() == [0, 10] and kv.tolist() == [0, 8]
    plan = plan_query_chunk(spans, 20, 50, kept=[30, 5, 40])
    no_prefix = FlashInferQueryChunk(
        plan, spans, [None, None, None], torch.empty(0), own_slots=torch.arange(20)
    )
    assert no_prefix.paged[0].tolist() == [0, 20, 20, 20] and no_prefix.earlier is None
    spans = [Span(0, 0, 40)]
    first = FlashInferQueryChunk(plan_query_chunk(spans, 0, 20), spans, [None], torch.empty(0))
    assert first.paged is None and first.earlier is None  # a cold chunk: one ragged call
    second = plan_query_chunk(spans, 20, 40, kept=[40])
    with pytest.raises(ValueError, match="need their slots"):
        FlashInferQueryChunk(second, spans, [None], torch.empty(0))


def _flashinfer_on_cuda():
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _flashinfer_on_cuda(), reason="needs CUDA and flashinfer")
@pytest.mark.parametrize(
    "prefix_lens, new_lens, chunk, kept",
    [
        ([0], [300], 64, None),
        ([0], [300], 64, [150]),  # half of it without a pool slot: the layer keeps it
        ([100], [257], 128, [100]),
        ([0, 40, 0], [150, 33, 90], 96, [70, 33, 10]),
    ],
)
def test_chunks_equal_naive_attention_on_cuda(prefix_lens, new_lens, chunk, kept, monkeypatch):
    import test_prefill_attention_kernel

    monkeypatch.setattr(test_prefill_attention_kernel, "D", 64)  # a head size FlashInfer has
    batch = make_batch(prefix_lens, new_lens, heads=(8, 2), dtype=torch.float32)
    want = expected(*batch, 0.125)
    spans, slots, q, k, v, k_pool, v_pool = batch
    half = (spans, slots, *(t.half() for t in (q, k, v, k_pool, v_pool)))
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrappers: dict = {}

    def attention(plan, spans, slots, own):
        return FlashInferQueryChunk(
            plan, spans, slots, workspace, wrappers.setdefault(plan.start, {}), own_slots=own
        )

    got = run_chunks(half, chunk, kept, "scattered", attention, 0.125, device="cuda")
    assert (got.double() - want).abs().max() < 1e-2


def test_windowed_keys_end_at_each_piece_and_start_where_the_window_reaches():
    """With a window or sinks each piece attends to one gathered run of keys (FlashInfer's
    bottom-right window alignment is right only there): the pool's keys, the kept ones
    and the chunk's rows its queries can see. Plain Python."""
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    plan = plan_query_chunk(spans, 20, 50, kept=[12, 5, 40])
    # full layer: the head's pool keys (prefix 10 + 12 of its own), its 8 kept keys, its
    # chunk rows; the others: their prefix and their rows
    assert windowed_keys(plan, spans, None) == [
        (0, 22, 0, 8, 0, 10),
        (0, 0, 0, 0, 10, 15),
        (0, 7, 0, 0, 15, 30),
    ]
    # window 4: the head's first query is at position 10 + 20 = 30, so keys from 26: none
    # of the pool's (positions 0..22), its kept keys from the 4th (positions 22..30); the
    # third request's first query at 7 sees prefix positions 3..6
    assert windowed_keys(plan, spans, 4) == [
        (22, 22, 4, 8, 0, 10),
        (0, 0, 0, 0, 10, 15),
        (3, 7, 0, 0, 15, 30),
    ]


class _RaggedLikeFlashInfer:
    """FlashInfer's ragged prefill as documented, in torch (for the CPU check of the
    gathered path's rows and sink math): bottom-right causal, window_left, base-2 lse."""

    def plan(self, qo_indptr, kv_indptr, heads, kv_heads, d, causal, sm_scale, window_left, **_):
        self.qo, self.kv, self.scale, self.window = qo_indptr, kv_indptr, sm_scale, window_left

    def run(self, q, k, v, return_lse):
        outs, lses = [], []
        for i in range(len(self.qo) - 1):
            qs, ks = slice(self.qo[i], self.qo[i + 1]), slice(self.kv[i], self.kv[i + 1])
            n, m = qs.stop - qs.start, ks.stop - ks.start
            g = q.shape[1] // k.shape[1]
            kk = k[ks].double().repeat_interleave(g, 1)
            vv = v[ks].double().repeat_interleave(g, 1)
            s = torch.einsum("qhd,khd->hqk", q[qs].double(), kk) * self.scale
            rel = torch.arange(m - n, m).unsqueeze(1) - torch.arange(m)
            seen = (rel >= 0) & ((rel <= self.window) if self.window >= 0 else True)
            s = s.masked_fill(~seen, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vv).float())
            lses.append((torch.logsumexp(s, -1) / math.log(2.0)).T.float())
        return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("window, sinks", [(8, None), (None, True), (8, True)], ids=str)
def test_the_gathered_path_is_the_windowed_softmax_with_sinks(window, sinks):
    """The gathered rows, the window and the sinks (from a base-2 lse), through a torch
    stand-in of FlashInfer's documented ragged semantics: the CPU kernels' naive softmax
    (test_attention_sinks_windows.py). What FlashInfer itself does is checked on CUDA;
    kept keys (rows without a pool slot) in tests/test_query_chunk_layer_keys.py."""
    from test_attention_sinks_windows import expected as windowed_expected
    from test_attention_sinks_windows import sinks_for

    batch = make_batch([40, 0, 12], [77, 9, 30])
    spans, slots, q, k, v, k_pool, v_pool = batch
    sink_logits = sinks_for(q.shape[1]) if sinks else None
    want = windowed_expected(spans, slots, q, k, v, k_pool, v_pool, window, sink_logits)

    def attention(plan, spans, slots, own):
        return FlashInferQueryChunk(
            plan, spans, slots, torch.empty(0),
            wrappers={("ragged", window): _RaggedLikeFlashInfer()}, own_slots=own,
        )  # fmt: skip

    got = run_chunks(
        batch, 24, None, "consecutive", attention, 16**-0.5, window=window, sinks=sink_logits
    )
    assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.skipif(not _flashinfer_on_cuda(), reason="needs CUDA and flashinfer")
@pytest.mark.parametrize("window, sinks", [(16, None), (None, True), (16, True)], ids=str)
def test_windows_and_sinks_equal_naive_attention_on_cuda(window, sinks, monkeypatch):
    import test_attention_sinks_windows
    import test_prefill_attention_kernel

    monkeypatch.setattr(test_prefill_attention_kernel, "D", 64)
    monkeypatch.setattr(test_attention_sinks_windows, "SCALE", 0.125)
    batch = make_batch([100, 0], [150, 60], heads=(8, 2))
    spans, slots, q, k, v, k_pool, v_pool = batch
    sink_logits = test_attention_sinks_windows.sinks_for(8) if sinks else None
    want = test_attention_sinks_windows.expected(
        spans, slots, q, k, v, k_pool, v_pool, window, sink_logits
    )
    half = (spans, slots, *(t.half() for t in (q, k, v, k_pool, v_pool)))
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrappers: dict = {}

    def attention(plan, spans, slots, own):
        return FlashInferQueryChunk(
            plan, spans, slots, workspace, wrappers.setdefault(plan.start, {}), own_slots=own
        )

    s = None if sink_logits is None else sink_logits.cuda()
    got = run_chunks(
        half, 64, [120, 30], "scattered", attention, 0.125, device="cuda", window=window, sinks=s
    )
    assert (got.double() - want).abs().max() < 1e-2


class _RecordingWrapper:
    """Stands in for a FlashInfer wrapper on CPU (flashinfer needs CUDA): records its plans
    and answers run() with zeros of the query's shape."""

    def __init__(self, *args, **kwargs) -> None:
        self.plans: list[tuple] = []

    def reset_workspace_buffer(self, float_workspace, int_workspace) -> None:
        pass

    def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
        assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu"
        self.plans.append((qo_indptr.tolist(), kv_indptr.tolist(), args))

    def run(self, q, k, v=None, return_lse=False):
        return torch.zeros_like(q), torch.zeros(q.shape[:2])


def test_a_chunk_plans_once_per_forward_and_replans_when_shared_or_reshaped(monkeypatch):
    """A forward's layers share each chunk's plan (a plan per layer made every layer of a
    chunked forward wait on the host: issue 62's card run); a wrapper another chunk
    planned since, or a layer of another shape, is planned again. The index arrays go to
    the plan on the host."""
    fake = SimpleNamespace(merge_state=lambda o, lse, o2, lse2: (o, lse))
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    spans = [Span(0, 0, 40)]
    first, second = (plan_query_chunk(spans, a, b, kept=[40]) for a, b in ((0, 20), (20, 40)))
    own = {"ragged": _RecordingWrapper()}
    chunk = FlashInferQueryChunk(first, spans, [None], torch.empty(0), own)
    k = v = torch.zeros(20, 2, 16)
    pool = torch.zeros(40, 2, 16)
    q = torch.zeros(20, 4, 16)
    for _ in range(3):  # three layers
        chunk(q, k, v, pool, pool, 0.25)
    assert len(own["ragged"].plans) == 1
    chunk(torch.zeros(20, 8, 16), k, v, pool, pool, 0.25)  # a layer with other head counts
    assert len(own["ragged"].plans) == 2

    shared = {"ragged": _RecordingWrapper(), "paged": _RecordingWrapper()}
    a = FlashInferQueryChunk(first, spans, [None], torch.empty(0), shared)
    b = FlashInferQueryChunk(
        second, spans, [None], torch.empty(0), shared, own_slots=torch.arange(20)
    )
    for _ in range(2):  # two layers, each running both chunks
        a(q, k, v, pool, pool, 0.25)
        b(q, k, v, pool, pool, 0.25)
    ragged = shared["ragged"].plans
    # alternating: replanned (the chunks' own rows alike, but each chunk holds its own)
    assert [p[0] for p in ragged] == [[0, 20]] * 4 and len(ragged) == 4
    assert [p[1] for p in shared["paged"].plans] == [[0, 20]]  # the second's 20 earlier rows
