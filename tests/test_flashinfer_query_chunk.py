"""FlashInfer's query-chunk attention (CUDA path of layers run in query chunks): its plan on
CPU (which rows are queries and keys of which request: plain Python), its values against a
naive attention wherever CUDA and flashinfer are present (skipped on the CPU machines)."""

from __future__ import annotations

import math

import pytest
import torch
from test_prefill_attention_kernel import expected, make_batch

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges
from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import (
    FlashInferQueryChunk,
    chunk_pieces,
    windowed_keys,
)
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk


def test_pieces_and_indptrs_of_a_chunk():
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    plan = plan_query_chunk(spans, 20, 50)
    # head: queries 0..10 of the chunk, own keys rows 0..30; then the two that begin in it
    assert chunk_pieces(plan, spans) == [(0, 0, 10, 0, 30), (1, 10, 5, 30, 5), (2, 15, 15, 35, 15)]
    slots = [torch.arange(10), None, torch.arange(100, 107)]
    chunk = FlashInferQueryChunk(plan, spans, slots, workspace=torch.empty(0))
    assert chunk.kv_rows == slice(0, 50)
    assert chunk.qo_indptr.tolist() == [0, 10, 15, 30]
    assert chunk.kv_indptr.tolist() == [0, 30, 35, 50]
    indptr, indices, last_page = chunk.paged
    assert indptr.tolist() == [0, 10, 10, 17]
    assert indices.tolist() == list(range(10)) + list(range(100, 107))
    no_prefix = FlashInferQueryChunk(plan, spans, [None, None, None], workspace=torch.empty(0))
    assert no_prefix.paged is None


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
    "prefix_lens, new_lens, chunk",
    [([0], [300], 64), ([100], [257], 128), ([0, 40, 0], [150, 33, 90], 96)],
)
def test_chunks_equal_naive_attention_on_cuda(prefix_lens, new_lens, chunk, monkeypatch):
    import test_prefill_attention_kernel

    monkeypatch.setattr(test_prefill_attention_kernel, "D", 64)  # a head size FlashInfer has
    spans, slots, q, k, v, k_pool, v_pool = make_batch(
        prefix_lens, new_lens, heads=(8, 2), dtype=torch.float32
    )
    want = expected(spans, slots, q, k, v, k_pool, v_pool, 0.125)
    cuda = [t.cuda().half() for t in (q, k, v, k_pool, v_pool)]
    q, k, v, k_pool, v_pool = cuda
    slots = [None if s is None else s.cuda() for s in slots]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrappers = {}
    got = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device="cuda")
    for start, end in chunk_ranges(q.shape[0], chunk):
        plan = plan_query_chunk(spans, start, end)
        attention = FlashInferQueryChunk(plan, spans, slots, workspace, wrappers)
        got[start:end] = attention(q[start:end], k, v, k_pool, v_pool, 0.125)
    assert (got.double().cpu() - want).abs().max() < 1e-2


def test_windowed_keys_end_at_each_piece_and_start_where_the_window_reaches():
    """With a window or sinks each piece attends to one gathered run of keys (FlashInfer's
    bottom-right window alignment is right only there): the prefix positions and own-key
    rows its queries can see. Plain Python."""
    spans = [Span(0, 10, 30), Span(30, 0, 5), Span(35, 7, 40)]
    plan = plan_query_chunk(spans, 20, 50)
    # full layer: the whole prefix, then every own key up to the piece's last query
    assert windowed_keys(plan, spans, None) == [(0, 10, 0, 30), (0, 0, 30, 35), (0, 7, 35, 50)]
    # window 4: the head's first query is at position 10 + 20 = 30, so keys from 26 (own
    # row 16); the third request's first query at 7 sees prefix positions 3..6
    assert windowed_keys(plan, spans, 4) == [(10, 10, 16, 30), (0, 0, 30, 35), (3, 7, 35, 50)]


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
    (test_attention_sinks_windows.py). What FlashInfer itself does is checked on CUDA."""
    from test_attention_sinks_windows import expected as windowed_expected
    from test_attention_sinks_windows import sinks_for

    spans, slots, q, k, v, k_pool, v_pool = make_batch([40, 0, 12], [77, 9, 30])
    sink_logits = sinks_for(q.shape[1]) if sinks else None
    want = windowed_expected(spans, slots, q, k, v, k_pool, v_pool, window, sink_logits)
    got = torch.empty_like(want, dtype=q.dtype)
    for start, end in chunk_ranges(q.shape[0], 24):
        chunk = FlashInferQueryChunk(
            plan_query_chunk(spans, start, end), spans, slots, torch.empty(0),
            wrappers={("ragged", window): _RaggedLikeFlashInfer()},
        )  # fmt: skip
        got[start:end] = chunk(
            q[start:end], k, v, k_pool, v_pool, 16**-0.5, window=window, sinks=sink_logits
        )
    assert (got.double() - want).abs().max() < 1e-5


@pytest.mark.skipif(not _flashinfer_on_cuda(), reason="needs CUDA and flashinfer")
@pytest.mark.parametrize("window, sinks", [(16, None), (None, True), (16, True)], ids=str)
def test_windows_and_sinks_equal_naive_attention_on_cuda(window, sinks, monkeypatch):
    import test_attention_sinks_windows
    import test_prefill_attention_kernel

    monkeypatch.setattr(test_prefill_attention_kernel, "D", 64)
    monkeypatch.setattr(test_attention_sinks_windows, "SCALE", 0.125)
    spans, slots, q, k, v, k_pool, v_pool = make_batch([100, 0], [150, 60], heads=(8, 2))
    sink_logits = test_attention_sinks_windows.sinks_for(8) if sinks else None
    want = test_attention_sinks_windows.expected(
        spans, slots, q, k, v, k_pool, v_pool, window, sink_logits
    )
    q, k, v, k_pool, v_pool = [t.cuda().half() for t in (q, k, v, k_pool, v_pool)]
    slots = [None if s is None else s.cuda() for s in slots]
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrappers = {}
    got = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype, device="cuda")
    for start, end in chunk_ranges(q.shape[0], 64):
        chunk = FlashInferQueryChunk(
            plan_query_chunk(spans, start, end), spans, slots, workspace, wrappers
        )
        s = None if sink_logits is None else sink_logits.cuda()
        got[start:end] = chunk(q[start:end], k, v, k_pool, v_pool, 0.125, window=window, sinks=s)
    assert (got.double().cpu() - want).abs().max() < 1e-2


class _RecordingWrapper:
    """Stands in for a FlashInfer wrapper on CPU (flashinfer needs CUDA): records its plans
    and answers run() with zeros of the query's shape."""

    def __init__(self) -> None:
        self.plans: list[tuple] = []

    def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
        assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu"
        self.plans.append((qo_indptr.tolist(), kv_indptr.tolist(), args))

    def run(self, q, k, v, return_lse=False):
        return torch.zeros_like(q), torch.zeros(q.shape[:2])


def test_a_chunk_plans_once_per_forward_and_replans_when_shared_or_reshaped():
    """A forward's layers share each chunk's plan (a plan per layer made every layer of a
    chunked forward wait on the host: issue 62's card run); a wrapper another chunk
    planned since, or a layer of another shape, is planned again. The index arrays go to
    the plan on the host."""
    spans = [Span(0, 0, 40)]
    first, second = plan_query_chunk(spans, 0, 20), plan_query_chunk(spans, 20, 40)
    own = {"ragged": _RecordingWrapper()}
    chunk = FlashInferQueryChunk(first, spans, [None], torch.empty(0), own)
    k = v = torch.zeros(40, 2, 16)
    q = torch.zeros(20, 4, 16)
    for _ in range(3):  # three layers
        chunk(q, k, v, k, v, 0.25)
    assert len(own["ragged"].plans) == 1
    chunk(torch.zeros(20, 8, 16), k, v, k, v, 0.25)  # a layer with other head counts
    assert len(own["ragged"].plans) == 2

    shared = {"ragged": _RecordingWrapper()}
    a = FlashInferQueryChunk(first, spans, [None], torch.empty(0), shared)
    b = FlashInferQueryChunk(second, spans, [None], torch.empty(0), shared)
    for _ in range(2):  # two layers, each running both chunks
        a(q, k, v, k, v, 0.25)
        b(q, k, v, k, v, 0.25)
    plans = shared["ragged"].plans
    assert [p[0] for p in plans] == [[0, 20], [0, 20]] * 2  # alternating: replanned
    assert [p[1] for p in plans] == [[0, 20], [0, 40]] * 2
