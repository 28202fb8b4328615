"""One paged pass per layer for a packed extend batch (issue 83; prefill_attention/
one_pass.py, flashinfer_one_pass.py, the FlashInfer backend's one-pass path).

FlashInfer cannot run here: its wrappers are tests/flashinfer_standin.py, plain torch
written from FlashInfer's kernels (bottom-right causal alignment, the multi-item-scoring
mask, base-2 log-sum-exps). On them, one batch holding a prefix group behind a cached
prefix, a cold group, a follower whose leader is not beside it and lone requests is
attended three ways: the one-pass path, today's path (the batch's k / v written first,
then ragged + paged prefix + merge: FlashInferQueryChunk over the whole batch, as the
backend's forward_query_chunk runs it), and each request alone through transformers'
own attention (modeling_llama.eager_attention_forward) over its whole sequence. What
SGLang and prefill_kv would have done before the forward (the request table's rows,
followers' borrowed slots, DROPPED_SLOT for dropped rows) is written by hand here.
"""

from __future__ import annotations

import dataclasses
import sys
from types import SimpleNamespace

import flashinfer_standin
import pytest
import torch
from sync_guard import DeviceSyncGuard

# transformers and the backend (SGLang's FlashInfer module) are imported here, before the
# stand-in enters sys.modules: both look for flashinfer's module spec when imported
from transformers.models.llama.modeling_llama import eager_attention_forward

from prefillonly_sgl.features.prefill_attention.one_pass import (
    MAX_ITEM_TOKENS,
    Member,
    group_members,
    plan,
)
from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
    PrefillOnlyFlashInferBackend,
)
from prefillonly_sgl.features.prefill_kv.policy import DROPPED_SLOT
from prefillonly_sgl.hooking import process_state

HEADS, KV_HEADS, DIM = 4, 2, 16
SCALE = DIM**-0.5


# -- the plan (plain) ----------------------------------------------------------------
def test_a_group_is_its_head_and_the_followers_right_behind_it():
    members = [
        Member(40, 34),  # head: 40 cached, Q up to S = 64, then its item
        Member(64, 12, leader=0),
        Member(64, 9, leader=1),  # packed behind the follower before it (same S)
        Member(0, 13),
        Member(64, 5, leader=0),  # its leader is not right before it: alone
        Member(50, 7, leader=3),  # its prefix differs from its leader's group: alone
    ]
    assert group_members(members) == [[0, 1, 2], [3], [4], [5]]
    p = plan(members)
    group = p.sequences[0]
    assert group.prefix_len == 64 and group.item_lens == (10, 12, 9)
    assert group.kv_len == 64 + 31 and group.qo_len == 34 + 12 + 9
    # a lone request: everything causal (prefix_len = its kv length)
    assert [s.prefix_len for s in p.sequences[1:]] == [13, 69, 57]
    assert p.qo_indptr == [0, 55, 68, 73, 80] and p.kv_indptr == [0, 95, 108, 177, 234]
    assert p.grouped and p.max_item_lens() == [12, 0, 0, 0]


def test_item_positions_count_each_item_from_one():
    p = plan([Member(0, 5), Member(3, 2, leader=0), Member(3, 3, leader=1), Member(0, 4)])
    assert p.token_pos_len() == 7
    assert p.token_pos().tolist() == [1, 2, 1, 2, 1, 2, 3] + [0] * 7
    cached, new = p.kv_positions()
    assert cached == [] and new.tolist() == list(range(14))


def test_a_head_whose_cache_reaches_past_s_keeps_those_keys_in_its_item():
    """The head's cached prefix is longer than what its followers share: its keys past S
    are its item's first tokens (keys without queries, before the first query)."""
    p = plan([Member(30, 4), Member(20, 6, leader=0)])
    (seq,) = p.sequences
    assert seq.prefix_len == 20 and seq.item_lens == (14, 6)
    assert seq.kv_len == 40 and seq.qo_len == 10
    cached, new = p.kv_positions()
    assert cached == [(0, 0, 0, 30)] and new.tolist() == list(range(30, 40))


def test_items_past_uint16_run_alone():
    p = plan([Member(0, 10 + MAX_ITEM_TOKENS + 1), Member(10, 5, leader=0)])
    assert not p.grouped and len(p.sequences) == 2


# -- the backend on the stand-in -------------------------------------------------------
# (prefix_len, new_len, leader, kept): kept = new rows with a real slot (prefill-only KV:
# the head keeps its Q part, every item's rows are dropped)
BATCH = [
    (40, 34, None, 24),  # head behind a cached 40-token prefix: Q = [40, 64), then an item
    (64, 12, 0, 0),
    (64, 9, 1, 0),
    (0, 38, None, 30),  # a cold group: Q = [0, 30), then items
    (30, 7, 3, 0),
    (30, 11, 4, 0),
    (0, 13, None, 13),  # lone cold request keeping everything
    (20, 6, None, 0),  # lone request behind a cached prefix
    (30, 5, 3, 0),  # follows the cold head, but not right behind the group: alone
]
POOL_ROWS = [3, 5, 6, 1, 2, 7, 0, 4, 8]  # request-table rows, not in batch order
SLOTS = 512


def _layer():
    from sglang.srt.layers.radix_attention import AttentionType

    return SimpleNamespace(
        layer_id=0,
        tp_q_head_num=HEADS,
        tp_k_head_num=KV_HEADS,
        tp_v_head_num=KV_HEADS,
        head_dim=DIM,
        qk_head_dim=DIM,
        v_head_dim=DIM,
        scaling=SCALE,
        logit_cap=0.0,
        sliding_window_size=-1,
        k_scale=None,
        v_scale=None,
        is_cross_attention=False,
        attn_type=AttentionType.DECODER,
    )


class _Pool:
    def __init__(self, k, v) -> None:
        self.k, self.v = k.clone(), v.clone()
        self.written: list[torch.Tensor] = []

    def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
        self.written.append(loc.loc.clone())
        self.k[loc.loc] = k.view(self.k[loc.loc].shape)
        self.v[loc.loc] = v.view(self.v[loc.loc].shape)

    def get_kv_buffer(self, layer_id):
        return self.k, self.v


def _scenario(device="cpu"):
    """The batch as SGLang and prefill_kv leave it before the forward."""
    g = torch.Generator().manual_seed(0)
    k_pool = torch.randn(SLOTS, KV_HEADS, DIM, generator=g)
    v_pool = torch.randn(SLOTS, KV_HEADS, DIM, generator=g)
    k_pool[DROPPED_SLOT] = 0
    v_pool[DROPPED_SLOT] = 0
    table = torch.zeros(16, 256, dtype=torch.int32)
    free = iter(range(1, 200))  # cached prefixes and kept rows get real slots
    out_cache_loc = []
    for i, (p, n, leader, kept) in enumerate(BATCH):
        row = POOL_ROWS[i]
        if leader is None:
            table[row, :p] = torch.tensor([next(free) for _ in range(p)], dtype=torch.int32)
        else:  # a follower's [0, S): its leader's slots (prefill_kv._read_leaders_slots)
            table[row, :p] = table[POOL_ROWS[leader], :p]
        locs = [next(free) for _ in range(kept)] + [DROPPED_SLOT] * (n - kept)
        out_cache_loc.extend(locs)
        table[row, p : p + n] = torch.tensor(locs, dtype=torch.int32)
    rows = len(out_cache_loc)
    q = torch.randn(rows, HEADS * DIM, generator=g)
    k = torch.randn(rows, KV_HEADS * DIM, generator=g)
    v = torch.randn(rows, KV_HEADS * DIM, generator=g)
    return SimpleNamespace(
        k_pool=k_pool,
        v_pool=v_pool,
        table=table,
        out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64),
        q=q,
        k=k,
        v=v,
        rows=rows,
    )


def _forward_batch(s):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        out_cache_loc=s.out_cache_loc,
        req_pool_indices=torch.tensor(POOL_ROWS),
        req_pool_indices_cpu=torch.tensor(POOL_ROWS),
        extend_prefix_lens_cpu=[b[0] for b in BATCH],
        extend_seq_lens_cpu=[b[1] for b in BATCH],
    )


def _backend(s, scratch: torch.Tensor | None):
    backend = object.__new__(PrefillOnlyFlashInferBackend)
    backend.token_to_kv_pool = _Pool(s.k_pool, s.v_pool)
    backend.req_to_token_pool = SimpleNamespace(req_to_token=s.table)
    backend.workspace_buffer = torch.empty(8, dtype=torch.uint8)
    backend.kv_cache_quant_method = SimpleNamespace(needs_global_scale=lambda: False)
    backend.prefill_wrappers_paged = []
    if scratch is not None:
        backend.use_scratch(scratch)
    return backend


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_standin.module())
    state = process_state.current()
    leaders = {POOL_ROWS[i]: POOL_ROWS[b[2]] for i, b in enumerate(BATCH) if b[2] is not None}
    monkeypatch.setattr(state, "prefill_kv", dataclasses.replace(state.prefill_kv, leaders=leaders))
    return state


def _one_pass(s):
    scratch = torch.arange(300, 300 + s.rows, dtype=torch.int64)
    backend = _backend(s, scratch)
    fb = _forward_batch(s)
    backend.init_forward_metadata(fb)
    assert backend._one_pass is not None
    out = backend.forward_extend(s.q, s.k, s.v, _layer(), fb)
    return out, backend


def _three_pass(s):
    backend = _backend(s, None)
    fb = _forward_batch(s)
    backend._query_chunks, backend._chunk_spans, backend._chunk_wrappers = {}, None, {}
    k = s.k.view(s.rows, KV_HEADS, DIM)  # hybrid prefilling hands the layer's k / v so
    v = s.v.view(s.rows, KV_HEADS, DIM)
    return backend.forward_query_chunk(s.q, k, v, _layer(), fb, 0, s.rows)


def _transformers_reference(s):
    """Each request alone over its whole sequence: its prefix keys from the pool (its
    request-table row), then its own new k / v; transformers' eager attention with a
    bottom-right causal mask."""
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, training=False)
    # a follower's prefix holds its leader's kept rows of this very forward
    kept = s.out_cache_loc != DROPPED_SLOT
    k_pool, v_pool = s.k_pool.clone(), s.v_pool.clone()
    k_pool[s.out_cache_loc[kept]] = s.k.view(s.rows, KV_HEADS, DIM)[kept]
    v_pool[s.out_cache_loc[kept]] = s.v.view(s.rows, KV_HEADS, DIM)[kept]
    out = torch.empty(s.rows, HEADS * DIM)
    row = 0
    for i, (p, n, _, _) in enumerate(BATCH):
        slots = s.table[POOL_ROWS[i], :p].long()
        keys = torch.cat([k_pool[slots], s.k[row : row + n].view(n, KV_HEADS, DIM)])
        values = torch.cat([v_pool[slots], s.v[row : row + n].view(n, KV_HEADS, DIM)])
        q = s.q[row : row + n].view(n, HEADS, DIM)
        positions = torch.arange(p, p + n).unsqueeze(1)
        mask = torch.where(torch.arange(p + n).unsqueeze(0) <= positions, 0.0, float("-inf"))
        o, _ = eager_attention_forward(
            module,
            q.transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            mask.view(1, 1, n, p + n),
            scaling=SCALE,
        )
        out[row : row + n] = o.reshape(n, HEADS * DIM)
        row += n
    return out


def test_one_pass_equals_todays_three_passes_and_transformers(standin):
    s = _scenario()
    one, backend = _one_pass(s)
    three = _three_pass(s)
    reference = _transformers_reference(s)
    assert (three - reference).abs().max() < 1e-5  # today's path, as a check of the check
    assert (one - reference).abs().max() < 1e-5
    assert (one - three).abs().max() < 1e-5
    # the batch ran as 5 sequences (the two groups, three alone) under the item mask
    planned = backend._one_pass.attention.wrapper.planned
    assert planned["prefix"] == [64, 30, 13, 26, 35] and len(planned["qo"]) == 6


def test_one_pass_writes_kept_rows_to_their_slots_and_dropped_rows_to_scratch(standin):
    s = _scenario()
    _, backend = _one_pass(s)
    pool = backend.token_to_kv_pool
    (written,) = pool.written
    kept = s.out_cache_loc != DROPPED_SLOT
    assert torch.equal(written[kept], s.out_cache_loc[kept])  # the cache's slots
    scratch_rows = torch.arange(300, 300 + s.rows)[~kept]
    assert torch.equal(written[~kept], scratch_rows)
    k = s.k.view(s.rows, KV_HEADS, DIM)
    assert torch.equal(pool.k[s.out_cache_loc[kept]], k[kept])
    assert pool.k[DROPPED_SLOT].abs().sum() == 0  # nothing lands on the dummy slot


def test_a_forward_longer_than_the_scratch_runs_as_before(standin):
    s = _scenario()
    backend = _backend(s, torch.arange(300, 300 + s.rows - 1))
    assert backend._one_pass_for(_forward_batch(s)) is None


def test_without_scratch_the_backend_never_takes_the_one_pass_path(standin):
    s = _scenario()
    assert _backend(s, None)._one_pass_for(_forward_batch(s)) is None


def test_the_one_pass_path_never_waits_for_the_device(standin):
    """Its plan (the kv index list built on the device from host arrays, the item
    arrays), the writes and the pass, two layers, on the meta device under the guard;
    the wrapper is planned once per forward."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    meta = torch.device("meta")
    rows = sum(b[1] for b in BATCH)

    class MetaPool:
        def __init__(self):
            self.k = torch.empty(SLOTS, KV_HEADS, DIM, device=meta)
            self.v = torch.empty_like(self.k)

        def set_kv_buffer(self, layer, loc, k, v, k_scale=None, v_scale=None):
            self.k.index_copy_(0, loc.loc, k)
            self.v.index_copy_(0, loc.loc, v)

        def get_kv_buffer(self, layer_id):
            return self.k, self.v

    class CountingWrapper:
        plans = 0

        def __init__(self, *args, **kwargs):
            pass

        def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
            assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu"
            CountingWrapper.plans += 1

        def run(self, q, kv_cache, **kwargs):
            return torch.empty_like(q)

    sys.modules["flashinfer"].BatchPrefillWithPagedKVCacheWrapper = CountingWrapper
    backend = object.__new__(PrefillOnlyFlashInferBackend)
    backend.token_to_kv_pool = MetaPool()
    backend.req_to_token_pool = SimpleNamespace(
        req_to_token=torch.zeros(16, 256, dtype=torch.int32, device=meta)
    )
    backend.workspace_buffer = torch.empty(8, dtype=torch.uint8, device=meta)
    backend.kv_cache_quant_method = SimpleNamespace(needs_global_scale=lambda: False)
    backend.prefill_wrappers_paged = []
    backend.use_scratch(torch.empty(rows + 7, dtype=torch.int64, device=meta))
    fb = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        out_cache_loc=torch.empty(rows, dtype=torch.int64, device=meta),
        req_pool_indices_cpu=torch.tensor(POOL_ROWS),
        extend_prefix_lens_cpu=[b[0] for b in BATCH],
        extend_seq_lens_cpu=[b[1] for b in BATCH],
    )
    q = torch.empty(rows, HEADS * DIM, device=meta)
    k = torch.empty(rows, KV_HEADS * DIM, device=meta)
    with DeviceSyncGuard():
        backend.init_forward_metadata(fb)
        for _ in range(2):
            out = backend.forward_extend(q, k, k.clone(), _layer(), fb)
            assert out.shape == (rows, HEADS * DIM)
    assert CountingWrapper.plans == 1


# -- prefill_kv's side: the scratch and the leaders ------------------------------------
def test_the_scheduler_is_told_a_pool_smaller_by_the_scratch(monkeypatch):
    from prefillonly_sgl.features.prefill_kv import scheduler_process as kv

    taken = []

    class Allocator:
        def alloc(self, n):
            taken.append(n)
            return torch.arange(1, n + 1)

    class Backend:
        scratch = None

        def one_pass_scratch_tokens(self, max_forward_tokens):
            return max_forward_tokens

        def use_scratch(self, slots):
            Backend.scratch = slots

    runner = SimpleNamespace(attn_backend=Backend(), token_to_kv_pool_allocator=Allocator())
    monkeypatch.setattr(kv.STATE, "one_pass", False)
    info = (100_000, 16_384, 64, 1000, 40_959, 40_954, 0, "cuda", None, 65, 40_960, 100_000)
    shrunk = kv._reserve_one_pass_scratch(runner, info)
    assert taken == [16_384] and Backend.scratch.shape == (16_384,) and kv.STATE.one_pass
    assert shrunk[0] == 100_000 - 16_384 and shrunk[4:6] == (40_959, 40_954)
    assert shrunk[1:4] == info[1:4] and shrunk[6:] == info[6:]
    # a pool too small for it: the limits follow the smaller pool
    assert kv.shrunk_worker_info((30_000, *info[1:]), 16_384)[4:6] == (13_615, 13_610)
    # a scratch of more than half the pool: off
    monkeypatch.setattr(kv.STATE, "one_pass", False)
    assert kv._reserve_one_pass_scratch(runner, (20_000, *info[1:])) == (20_000, *info[1:])
    assert not kv.STATE.one_pass


def test_each_batch_records_who_follows_whom_for_the_one_pass_path(monkeypatch):
    from prefillonly_sgl.features.prefill_kv import scheduler_process as kv

    monkeypatch.setattr(kv.STATE, "one_pass", True)
    monkeypatch.setattr(kv.STATE, "leaders", {9: 4})  # row 9 held a follower before
    table = torch.zeros(12, 64, dtype=torch.int32)
    leader = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=2))
    follower = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=5, cache_protected_len=0))
    setattr(follower, kv.FOLLOWER_MARK, kv._Follower(leader, packed=8, matched=0))
    stranger = SimpleNamespace(kv=SimpleNamespace(req_pool_idx=9))
    batch = SimpleNamespace(
        reqs=[leader, follower, stranger],
        req_to_token_pool=SimpleNamespace(req_to_token=table),
    )
    kv._read_leaders_slots(batch)
    assert kv.STATE.leaders == {5: 2}
