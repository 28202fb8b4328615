"""No host-device sync on ours' path (issue 73): the hooks that run between SGLang's
barrier and a forward's launch (prefill-only KV's allocation, a follower's row) and the
attention a layer runs in query chunks (the FlashInfer backend), with their device tensors
on torch's `meta` device under tests/sync_guard.py, which raises on any operation that
would make a CUDA host wait for the device.

FlashInfer cannot run here: its two wrappers and merge_state are stand-ins that take the
plan's host arrays and return outputs of the kernels' shapes (the code under test is what
prepares their inputs and writes the pool). Everything else is the engine's code.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch
from sync_guard import DeviceSyncGuard, HostDeviceSync
from test_prefill_kv_backend_support import RAGGED_ALWAYS

from prefillonly_sgl.features.prefill_kv import scheduler_process as kv
from prefillonly_sgl.features.prefill_kv.policy import DROPPED_SLOT

META = torch.device("meta")


def test_the_guard_refuses_what_syncs_on_a_card():
    """The guard itself: each kind of sync the issue names raises (so the tests below can
    fail), while host-built indices copied without blocking pass."""
    out = torch.zeros(6, dtype=torch.int64, device=META)
    real = torch.empty(3, dtype=torch.int64, device=META)
    mask = torch.tensor([True, True, False, False, False, True])
    syncs = [
        lambda: out.__setitem__(mask.to(META, non_blocking=True), real),  # the old allocation
        lambda: out[out != 0],
        lambda: out.tolist(),
        lambda: out[0].item(),
        lambda: out.nonzero(),
        lambda: out[torch.tensor([1, 2])],  # a host index, copied over blocking
        lambda: torch.tensor([0, 1, 5]).to(META),
    ]
    for sync in syncs:
        with pytest.raises(HostDeviceSync), DeviceSyncGuard():
            sync()
    with DeviceSyncGuard() as guard:
        out.index_copy_(0, torch.tensor([0, 1, 5]).to(META, non_blocking=True), real)
        out[1:3] = 7
    assert guard.ops


def test_prefill_only_kv_allocation_never_waits_for_the_device():
    """alloc_token_slots under a layout that drops KV: real slots for kept tokens, the
    dummy slot for the rest, built without a boolean mask on the device."""
    allocator = SimpleNamespace(device=META)
    tree_cache = SimpleNamespace(token_to_kv_pool_allocator=allocator)
    asked = []

    def original(cache, n):
        asked.append(n)
        return torch.empty(n, dtype=torch.int64, device=META)

    layout = kv._SlotLayout(kept=[3, 0, 2], extend_lens=[5, 4, 2])
    token = kv._PENDING_LAYOUT.set(layout)
    try:
        with DeviceSyncGuard() as guard:
            out = kv._around_alloc_token_slots(original, tree_cache, 11)
    finally:
        kv._PENDING_LAYOUT.reset(token)
    assert asked == [5] and out.shape == (11,) and out.device == META
    assert any("index_copy" in op for op in guard.ops)


def test_prefill_only_kv_allocation_places_the_real_slots():
    """The same on the CPU, with values: kept rows get the allocator's slots in order."""
    tree_cache = SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(device="cpu"))
    layout = kv._SlotLayout(kept=[3, 0, 2], extend_lens=[5, 4, 2])
    token = kv._PENDING_LAYOUT.set(layout)
    try:
        out = kv._around_alloc_token_slots(
            lambda cache, n: torch.arange(100, 100 + n), tree_cache, 11
        )
    finally:
        kv._PENDING_LAYOUT.reset(token)
    d = DROPPED_SLOT
    assert out.tolist() == [100, 101, 102, d, d, d, d, d, d, 103, 104]


def test_a_followers_row_is_written_on_the_device_alone():
    """_prefix_kv_indices and _read_leaders_slots (a follower reads its leader's slots of
    the same forward): slices and copies on the device, no reads back."""
    req_to_token = torch.zeros((4, 64), dtype=torch.int32, device=META)
    leader = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=1))
    follower = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=2, cache_protected_len=0))
    setattr(follower, kv.FOLLOWER_MARK, kv._Follower(leader, packed=20, matched=6))
    follower.prefix_len = 20
    batch = SimpleNamespace(
        device=META,
        reqs=[leader, follower],
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
    )
    with DeviceSyncGuard():
        row = kv._around_prefix_kv_indices(
            lambda b, r: torch.empty(r.prefix_len, dtype=torch.int64, device=META), batch, follower
        )
        kv._read_leaders_slots(batch)
    assert row.shape == (20,) and follower.prefix_len == 20
    assert follower.kv.cache_protected_len == 20


# -- the FlashInfer backend's query chunks, with FlashInfer's kernels stood in ----------
class _Wrapper:
    """FlashInfer's prefill wrapper as the chunk uses it: plan() takes host index arrays,
    run() returns (out, lse) of the kernel's shapes on the query's device."""

    plans = 0

    def __init__(self, workspace, layout, backend=None) -> None:
        self.planned_with = None

    def reset_workspace_buffer(self, float_workspace, int_workspace) -> None:
        assert int_workspace.device == float_workspace.device

    def plan(self, qo_indptr, *args, **kwargs):
        assert qo_indptr.device.type == "cpu"  # FlashInfer reads its plan on the host
        _Wrapper.plans += 1
        self.planned_with = (args, kwargs)

    def run(self, q, k, v=None, return_lse=False):
        return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def _fake_flashinfer():
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithRaggedKVCacheWrapper = _Wrapper
    module.BatchPrefillWithPagedKVCacheWrapper = _Wrapper
    module.merge_state = lambda o, lse, o2, lse2: (o, lse)
    return module


class _Pool:
    def __init__(self, slots, kv_heads, dim) -> None:
        self.k = torch.zeros((slots, kv_heads, dim), dtype=torch.bfloat16, device=META)
        self.v = torch.zeros_like(self.k)
        self.writes = []

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        self.writes.append(int(loc.loc.shape[0]))
        self.k[loc.loc] = k
        self.v[loc.loc] = v

    def get_kv_buffer(self, layer_id):
        return self.k, self.v


def _meta_backend(kv_heads: int, dim: int):
    """Our FlashInfer backend without SGLang's start-up (FlashInfer cannot run here): its
    pool, request table and workspace on the meta device; (backend, pool)."""
    from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
        PrefillOnlyFlashInferBackend,
    )

    backend = object.__new__(PrefillOnlyFlashInferBackend)
    pool = _Pool(256, kv_heads, dim)
    backend.token_to_kv_pool = pool
    backend.req_to_token_pool = SimpleNamespace(
        req_to_token=torch.zeros((4, 128), dtype=torch.int32, device=META)
    )
    backend.workspace_buffer = torch.empty(1024, dtype=torch.uint8, device=META)
    backend.kv_cache_quant_method = SimpleNamespace(needs_global_scale=lambda: False)
    return backend, pool


def test_flashinfer_query_chunks_never_wait_for_the_device(monkeypatch):
    """A long prompt (its prefix cached, its rows past the 40th dropped by prefill-only
    KV) and a short one in one extend batch, run in query chunks as hybrid prefilling's
    layers do, two layers: the pool writes (dropped rows to the dummy slot, not selected
    by a mask), the spans and kept counts (the host's request rows and prefill-only KV's
    record), the plans (once per chunk per forward), the layer's kept keys and the
    kernels' inputs, all without a sync."""
    import dataclasses

    from prefillonly_sgl.hooking import process_state

    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    state = process_state.current()
    monkeypatch.setattr(
        state,
        "prefill_kv",
        dataclasses.replace(state.prefill_kv, active=True, kept={1: 40, 3: 10}),
    )
    heads, kv_heads, dim = 4, 2, 16
    backend, pool = _meta_backend(kv_heads, dim)
    prefix, new = [30, 0], [70, 10]
    rows = sum(new)
    forward_batch = SimpleNamespace(
        out_cache_loc=torch.zeros(rows, dtype=torch.int64, device=META),
        req_pool_indices=torch.zeros(2, dtype=torch.int64, device=META),
        req_pool_indices_cpu=torch.tensor([1, 3]),
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=new,
    )
    layer = SimpleNamespace(
        layer_id=0,
        tp_q_head_num=heads,
        tp_k_head_num=kv_heads,
        tp_v_head_num=kv_heads,
        head_dim=dim,
        scaling=0.25,
        sliding_window_size=-1,
        k_scale=None,
        v_scale=None,
    )
    k_all = torch.empty((rows, kv_heads, dim), dtype=torch.bfloat16, device=META)
    v_all = torch.empty_like(k_all)
    chunk = 32
    _Wrapper.plans = 0
    with DeviceSyncGuard():
        # one forward: init_forward_metadata's per-forward reset, then the layers
        backend._query_chunks, backend._chunk_spans, backend._chunk_wrappers = {}, None, {}
        for _layer in range(2):
            keys = backend.new_layer_keys()
            for start in range(0, rows, chunk):
                end = min(start + chunk, rows)
                q = torch.empty((end - start, heads * dim), dtype=torch.bfloat16, device=META)
                out = backend.forward_query_chunk(
                    q, k_all[start:end], v_all[start:end], layer, forward_batch, start, end,
                    layer_keys=keys,
                )  # fmt: skip
                assert out.shape == (end - start, heads * dim)
            assert keys.by_request == {}
    n_chunks = -(-rows // chunk)
    assert pool.writes == [min(chunk, rows - s) for s in range(0, rows, chunk)] * 2
    # each chunk plans its ragged and its paged wrapper (every chunk holds rows of the
    # prompt whose prefix is cached) once per forward, and the last one the pass over the
    # prompt's 24 earlier rows without a slot: the second layer plans nothing
    assert _Wrapper.plans == 2 * n_chunks + 1 and len(backend._query_chunks) == n_chunks


def test_query_chunks_need_the_hosts_request_rows(monkeypatch):
    """A batch without SGLang's host copy of its request rows runs its layers whole:
    reading the device's copy would wait for it."""
    import dataclasses

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from prefillonly_sgl.features.prefill_attention import scheduler_flashinfer_backend as fi
    from prefillonly_sgl.hooking import process_state

    state = process_state.current()
    monkeypatch.setattr(
        state, "switches", dataclasses.replace(state.switches, cuda_query_chunks=True)
    )
    monkeypatch.setattr(fi, "_prefill_graph_backend", lambda: None)  # SGLang's server args
    backend = object.__new__(fi.PrefillOnlyFlashInferBackend)
    backend.__dict__.update(RAGGED_ALWAYS, forward_metadata=SimpleNamespace(use_ragged=True))
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, req_pool_indices_cpu=torch.tensor([0]))
    assert backend.supports_query_chunks(batch)
    batch.req_pool_indices_cpu = None
    assert not backend.supports_query_chunks(batch)


def test_an_fp8_pools_write_leaves_the_keys_attention_reads(monkeypatch):
    """With KV scales SGLang's set_kv_buffer divides k / v in place; ours writes before
    attention (followers, query chunks), so it hands the pool copies: the k / v the
    attention then reads are unscaled. The pool here is SGLang's write rule in a line."""
    from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
        PrefillOnlyFlashInferBackend,
    )

    class ScalingPool:
        def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
            if k_scale is not None:
                k.div_(k_scale)  # memory_pool.MHATokenToKVPool.set_kv_buffer's rule
            if v_scale is not None:
                v.div_(v_scale)

    backend = object.__new__(PrefillOnlyFlashInferBackend)
    backend.token_to_kv_pool = ScalingPool()
    backend.kv_cache_quant_method = SimpleNamespace(needs_global_scale=lambda: False)
    layer = SimpleNamespace(k_scale=2.0, v_scale=4.0)
    k, v = torch.ones(3, 2), torch.ones(3, 2)
    backend._write_kv(layer, None, k, v)
    assert k.eq(1).all() and v.eq(1).all()
    unscaled = SimpleNamespace(k_scale=None, v_scale=None)
    backend._write_kv(unscaled, None, k, v)  # no copies where nothing is scaled
    assert k.eq(1).all()


class _DecodeWrapper:
    def forward_return_lse(self, q, kv_cache, **kwargs):
        return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def test_attention_sinks_on_cuda_never_wait_for_the_device(monkeypatch):
    """gpt-oss through our FlashInfer backend (opt-in, sink_models.py): a windowed layer's
    extend with sinks (one query chunk over the batch, its keys gathered from the pool and
    the batch) and a decode step with sinks, under the guard."""
    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    heads, kv_heads, dim = 4, 2, 16
    backend, pool = _meta_backend(kv_heads, dim)
    backend.num_wrappers = 1
    backend.forward_metadata = SimpleNamespace(
        decode_wrappers=[_DecodeWrapper()], swa_out_cache_loc=None
    )
    layer = SimpleNamespace(
        layer_id=0,
        tp_q_head_num=heads,
        tp_k_head_num=kv_heads,
        tp_v_head_num=kv_heads,
        head_dim=dim,
        qk_head_dim=dim,
        v_head_dim=dim,
        scaling=0.25,
        logit_cap=0.0,
        sliding_window_size=16,
        k_scale=None,
        v_scale=None,
        k_scale_float=None,
        v_scale_float=None,
    )
    sinks = torch.zeros(heads, device=META)
    rows = 40
    batch = SimpleNamespace(
        out_cache_loc=torch.zeros(rows, dtype=torch.int64, device=META),
        req_pool_indices=torch.zeros(2, dtype=torch.int64, device=META),
        req_pool_indices_cpu=torch.tensor([1, 2]),
        extend_prefix_lens_cpu=[24, 0],
        extend_seq_lens_cpu=[30, 10],
    )
    q = torch.empty((rows, heads * dim), dtype=torch.bfloat16, device=META)
    k = torch.empty((rows, kv_heads * dim), dtype=torch.bfloat16, device=META)
    with DeviceSyncGuard():
        backend._query_chunks, backend._chunk_spans, backend._chunk_wrappers = {}, None, {}
        out = backend.forward_extend(q, k, k.clone(), layer, batch, sinks=sinks)
    assert out.shape == (rows, heads * dim) and pool.writes == [rows]
    decode = SimpleNamespace(out_cache_loc=torch.zeros(2, dtype=torch.int64, device=META))
    monkeypatch.setattr(
        "sglang.srt.mem_cache.memory_pool.KVWriteLoc.for_layer",
        staticmethod(
            lambda forward_batch, layer, swa_loc=None: SimpleNamespace(
                loc=forward_batch.out_cache_loc
            )
        ),
    )
    with DeviceSyncGuard():
        step = backend.forward_decode(q[:2], k[:2], k[:2].clone(), layer, decode, sinks=sinks)
    assert step.shape == (2, heads * dim) and pool.writes == [rows, 2]
