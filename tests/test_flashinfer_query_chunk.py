"""FlashInfer's query-chunk attention (CUDA path of layers run in query chunks): its plan on
CPU (which rows are queries and keys of which request: plain Python), its values against a
naive attention wherever CUDA and flashinfer are present (skipped on the CPU machines)."""

from __future__ import annotations

import pytest
import torch
from test_prefill_attention_kernel import expected, make_batch

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges
from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import (
    FlashInferQueryChunk,
    chunk_pieces,
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
