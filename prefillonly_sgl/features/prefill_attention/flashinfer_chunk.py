"""Attention of one query chunk of an extend batch with FlashInfer (CUDA path; plain torch +
flashinfer, no SGLang). The GPU counterpart of query_chunk.py, for decoder layers run in
query chunks (features/hybrid_prefill/layer_chunks.py).

The chunk's requests (plan.plan_query_chunk: the head, which began before the chunk, and
the rest) are consecutive in the batch, so their own keys in the chunk are the chunk's
rows: FlashInfer's ragged prefill over the chunk's k / v, causal, qo_indptr = kv_indptr
at each piece's first row. What each piece saw before the chunk is in two places:

- the pool (a paged KV, page size 1, attended without a mask): its cached prefix and,
  for the head, its earlier new tokens that own a slot (written by their chunks:
  forward_query_chunk writes a chunk's rows before its attention);
- for the head only, its earlier new tokens without a slot (prefill-only KV drops their
  KV): the keys the layer keeps for its later chunks (layer_keys.py), one more ragged
  call without a mask over the head's queries.

The parts are merged by their log-sum-exps (flashinfer.merge_state), as SGLang's own
ragged + paged extend does for a whole batch. Until 2026-11-28 the layer held its whole
K / V and the head's earlier keys were one run of it beside the chunk's (one ragged call,
bottom-right causal); a layer now holds only the dropped rows of a request that
continues past the chunk.

    chunk = FlashInferQueryChunk(plan, spans, prefix_slots, workspace, wrappers,
                                 own_slots=...)                   # per forward
    out = chunk(q, k, v, k_pool, v_pool, scale, earlier=...)      # per layer

A chunk plans its FlashInfer wrappers once per forward, at its first layer, and its other
layers only run: a plan reads its index arrays on the host and copies them to the device,
so planning per layer (as this did until 2026-11-27) cost every layer of every chunk a
plan. The index arrays stay on the host (FlashInfer reads them there; a device copy would
make it wait for the device to copy them back). `wrappers` belong to the chunk's position
in the forward (the backend keeps them across forwards), so no two chunks of a forward
share a plan. Each wrapper holds its plan's scheduling metadata in an int workspace of
its own, which FlashInfer allocates at 8 MiB: a 32k prompt in 2,048-row chunks made 32
of them, 256 MiB of the H200's +506 MiB peak (benchmarks/README.md). A chunk's plan
needs a few KiB, so each wrapper is given INT_WORKSPACE_BYTES (256 KiB) instead, and
FlashInfer's own size back should a plan ever overflow it.

Sliding windows and attention sinks (gpt-oss; the CPU kernels' windowed.py): FlashInfer's
`window_left` counts positions from its bottom-right alignment, which is right for the
ragged part (the piece's keys end at its last query) but not for the paged prefix planned
non-causal (there FlashInfer would place the queries at the prefix's end). So with a window
or sinks each piece's keys are gathered into one ragged run that ends at its last query:
the pool's keys the window reaches, the kept ones, then its own; one causal ragged call
with window_left, and the sinks applied from its log-sum-exp. FlashInfer returns base-2
log-sum-exps (vLLM merges them with is_lse_base_on_e=False), so the sink's share is
computed from lse * ln 2.

Backends as SGLang's FlashInfer backend picks them: the ragged wrapper "auto" (FA3 on
Hopper, FA2 elsewhere), the paged one FA2 (SGLang's prefill_backend). The GPU kit
(scripts/gpu_kit/) carries FA2's sources only, so benchmarks/gpu_prefill.py passes
ragged_backend="fa2".

tests/test_flashinfer_query_chunk.py checks the plans and the values on CPU with
FlashInfer's wrappers stood in (tests/flashinfer_standin.py), and against a naive
attention wherever CUDA and flashinfer are present.
"""

from __future__ import annotations

import math

import torch

from prefillonly_sgl.features.prefill_attention.plan import QueryChunkPlan, Span, from_whole_kv

PAGED_BACKEND = "fa2"  # SGLang's FlashInferAttnBackend.prefill_backend
# On a wrapper: (the chunk, the plan's arguments) of the plan it holds.
_PLAN_OWNER = "_prefillonly_plan_owner"
# A chunk wrapper's int workspace (its plan's scheduling metadata: a few arrays of the
# chunk's tiles, its rows + 1 offsets; ~10 KiB for 2,048 rows, ~70 KiB for 16,384);
# FlashInfer's default is 8 MiB, which a plan that overflows this gets back
# (FlashInferQueryChunk.planned).
INT_WORKSPACE_BYTES = 256 << 10
FLASHINFER_INT_WORKSPACE_BYTES = 8 << 20


def chunk_pieces(plan: QueryChunkPlan, spans: list[Span]) -> list[tuple[int, int, int]]:
    """Per request in the chunk, in batch order: (request, chunk-local first query, query
    count); its own keys in the chunk are the same rows. Plain Python."""
    pieces = []
    if plan.head is not None:
        pieces.append((plan.head, 0, plan.head_rows))
    for i, local in plan.rest:
        pieces.append((i, local.q_start, local.n_new))
    return pieces


def windowed_keys(
    plan: QueryChunkPlan, spans: list[Span], window: int | None
) -> list[tuple[int, int, int, int, int, int]]:
    """Per piece (chunk_pieces' order), the keys its queries can see, from the first one
    the window reaches (window None: all) to its last query, in three places: (pool from,
    pool to) of the piece's pool keys (its prefix, then the head's earlier new tokens
    that own a slot), (kept from, kept to) of the head's kept keys (its earlier new
    tokens without a slot), (row from, row to) of the chunk's rows. Plain Python."""
    keys = []
    for i, q_lo, n_q in chunk_pieces(plan, spans):
        head = i == plan.head
        pooled = spans[i].prefix_len + (plan.head_kept if head else 0)
        dropped = plan.head_dropped if head else 0
        first_q = pooled + dropped  # position of the piece's first query in the chunk
        lo = 0 if window is None else max(0, first_q - window)
        keys.append(
            (min(lo, pooled), pooled, min(max(0, lo - pooled), dropped), dropped, q_lo, q_lo + n_q)
        )
    return keys


class FlashInferQueryChunk:
    def __init__(
        self,
        plan: QueryChunkPlan,
        spans: list[Span],
        prefix_slots: list,
        workspace: torch.Tensor,
        wrappers: dict | None = None,
        ragged_backend: str = "auto",
        own_slots=None,
    ) -> None:
        """wrappers: this chunk position's FlashInfer wrappers, by kind (created here when
        missing; each holds one plan, which this chunk makes at its first layer).
        own_slots: the pool slots of the head's earlier new tokens that own one (its
        plan.head_kept first ones; a device tensor)."""
        self.backends = {
            "ragged": ragged_backend,
            "earlier": ragged_backend,
            "paged": PAGED_BACKEND,
        }
        pieces = chunk_pieces(plan, spans)
        qo = [0]
        for _, _, n_q in pieces:
            qo.append(qo[-1] + n_q)
        self.qo_indptr = torch.tensor(qo, dtype=torch.int32)
        self.kv_indptr = self.qo_indptr  # each piece's own keys in the chunk: its rows
        if plan.head_kept and (own_slots is None or int(own_slots.shape[0]) != plan.head_kept):
            raise ValueError(
                f"the head's {plan.head_kept} earlier new tokens in the pool need their slots"
            )
        slots = []
        for i, _, _ in pieces:
            mine = [prefix_slots[i]] if prefix_slots[i] is not None else []
            if i == plan.head and plan.head_kept:
                mine.append(own_slots)
            mine = [s.to(torch.int64) for s in mine if s.shape[0]]
            slots.append(None if not mine else mine[0] if len(mine) == 1 else torch.cat(mine))
        lens = [0 if s is None else int(s.shape[0]) for s in slots]
        self.paged = None
        if any(lens):
            indptr = [0]
            for n in lens:
                indptr.append(indptr[-1] + n)
            self.paged = (
                torch.tensor(indptr, dtype=torch.int32),
                torch.cat([s.to(torch.int32) for s in slots if s is not None]),
                torch.ones(len(pieces), dtype=torch.int32),
            )
        self.earlier = None
        if plan.head_dropped:
            self.earlier = (
                torch.tensor([0, plan.head_rows], dtype=torch.int32),
                torch.tensor([0, plan.head_dropped], dtype=torch.int32),
            )
        self.workspace = workspace
        self.wrappers = wrappers if wrappers is not None else {}
        self._plan, self._spans, self._slots = plan, spans, slots
        self._windowed: dict = {}  # window -> (kv_indptr, gather index pieces)

    def _wrapper(self, key):
        """The wrapper for `key` ("ragged" / "earlier" / "paged", or ("ragged", window)),
        made once, with an int workspace of INT_WORKSPACE_BYTES (module docstring)."""
        if key not in self.wrappers:
            import flashinfer

            kind = key if isinstance(key, str) else key[0]
            cls = (
                flashinfer.BatchPrefillWithPagedKVCacheWrapper
                if kind == "paged"
                else flashinfer.BatchPrefillWithRaggedKVCacheWrapper
            )
            wrapper = cls(self.workspace, "NHD", backend=self.backends[kind])
            _int_workspace(wrapper, self.workspace, INT_WORKSPACE_BYTES)
            self.wrappers[key] = wrapper
        return self.wrappers[key]

    def planned(self, key, args: tuple, plan) -> object:
        """The wrapper for `key`, planned by plan(wrapper) unless this chunk planned it
        with the same `args` (head counts, dims, scale, dtypes) already: the layers of a
        forward share the chunk's plan; a layer of another shape replans."""
        wrapper = self._wrapper(key)
        # A wrapper holds the last plan made on it: shared with another chunk (a caller's
        # one dict for all), it is replanned whenever the other chunk planned it since.
        if wrapper.__dict__.get(_PLAN_OWNER) != (self, args):
            try:
                plan(wrapper)
            except RuntimeError:
                # FlashInfer's workspace allocator refuses a plan past its buffer: give the
                # wrapper FlashInfer's own size back, once, and plan again
                if _int_workspace_bytes(wrapper) >= FLASHINFER_INT_WORKSPACE_BYTES:
                    raise
                _int_workspace(wrapper, self.workspace, FLASHINFER_INT_WORKSPACE_BYTES)
                plan(wrapper)
            wrapper.__dict__[_PLAN_OWNER] = (self, args)
        return wrapper

    def __call__(
        self, q, k, v, k_pool, v_pool, scale, window=None, sinks=None, earlier=None
    ) -> torch.Tensor:
        """q: (n, H, D) the chunk's queries; k / v: (n, Hkv, D) the chunk's own keys (or the
        layer's whole K / V: plan.from_whole_kv);
        k_pool / v_pool: (slots, Hkv, D); window: SGLang's sliding_window_size (None:
        full); sinks: (H,) sink logits; earlier: (k, v) of the head's earlier new tokens
        without a pool slot, (plan.head_dropped, Hkv, D). Returns (n, H, Dv)."""
        if k.shape[0] != q.shape[0]:  # the layer's whole K / V (the GPU kit's harness)
            first = None if self._plan.head is None else self._spans[self._plan.head].q_start
            k, v, earlier = from_whole_kv(self._plan, first, k, v)
        dropped = self._plan.head_dropped
        if dropped and (earlier is None or earlier[0].shape[0] != dropped):
            raise ValueError(f"the head's {dropped} earlier keys without a pool slot are needed")
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if window is not None or sinks is not None:
            return self._gathered(q, k, v, k_pool, v_pool, scale, window, sinks, earlier)
        heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[2]
        shape = (heads, kv_heads, d, scale, q.dtype, k_pool.dtype)
        ragged = self.planned(
            "ragged",
            shape,
            lambda w: w.plan(
                self.qo_indptr,
                self.kv_indptr,
                heads,
                kv_heads,
                d,
                causal=True,
                sm_scale=scale,
                q_data_type=q.dtype,
            ),
        )
        o, lse = ragged.run(q, k, v, return_lse=True)
        if self.paged is None and self.earlier is None:
            return o
        from flashinfer import merge_state

        if self.earlier is not None:
            qo, kv = self.earlier
            rows = self._plan.head_rows
            before = self.planned(
                "earlier",
                shape,
                lambda w: w.plan(
                    qo, kv, heads, kv_heads, d, causal=False, sm_scale=scale, q_data_type=q.dtype
                ),
            )
            k_e, v_e = (t.to(q.dtype).contiguous() for t in earlier)
            o_e, lse_e = before.run(q[:rows], k_e, v_e, return_lse=True)
            o_head, lse_head = merge_state(o[:rows], lse[:rows], o_e, lse_e)
            o[:rows], lse[:rows] = o_head, lse_head
        if self.paged is None:
            return o
        indptr, indices, last_page = self.paged
        paged = self.planned(
            "paged",
            shape,
            lambda w: w.plan(
                self.qo_indptr,
                indptr,
                indices.to(q.device),  # the pool's slots: already there in the engine
                last_page,
                heads,
                kv_heads,
                d,
                1,
                causal=False,
                sm_scale=scale,
                q_data_type=q.dtype,
                kv_data_type=k_pool.dtype,
            ),
        )
        # page size 1: (slots, 1, Hkv, D) pages
        o_pre, lse_pre = paged.run(q, (k_pool.unsqueeze(1), v_pool.unsqueeze(1)), return_lse=True)
        merged, _ = merge_state(o, lse, o_pre, lse_pre)
        return merged

    def _gathered(self, q, k, v, k_pool, v_pool, scale, window, sinks, earlier):
        """One causal ragged call over each piece's visible keys gathered (module docstring)."""
        device = q.device
        if window not in self._windowed:
            indptr, parts = [0], []
            for slots, (p_lo, p_hi, e_lo, e_hi, r_lo, r_hi) in zip(
                self._slots, windowed_keys(self._plan, self._spans, window)
            ):
                pool_rows = slots[p_lo:p_hi].long() if p_hi > p_lo else None
                parts.append((pool_rows, (e_lo, e_hi), (r_lo, r_hi)))
                indptr.append(indptr[-1] + (p_hi - p_lo) + (e_hi - e_lo) + (r_hi - r_lo))
            self._windowed[window] = (torch.tensor(indptr, dtype=torch.int32), parts)
        kv_indptr, parts = self._windowed[window]

        def gather(own, kept, pool):
            pieces = []
            for pool_rows, (e_lo, e_hi), (r_lo, r_hi) in parts:
                if pool_rows is not None:
                    pieces.append(pool.index_select(0, pool_rows.to(device)).to(own.dtype))
                if e_hi > e_lo:
                    pieces.append(kept[e_lo:e_hi].to(own.dtype))
                pieces.append(own[r_lo:r_hi])
            return torch.cat(pieces)

        heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[2]
        ragged = self.planned(
            ("ragged", window),
            (heads, kv_heads, d, scale, q.dtype),
            lambda w: w.plan(
                self.qo_indptr,
                kv_indptr,
                heads,
                kv_heads,
                d,
                causal=True,
                sm_scale=scale,
                window_left=-1 if window is None else window,
                q_data_type=q.dtype,
            ),
        )
        k_kept, v_kept = earlier if earlier is not None else (None, None)
        o, lse = ragged.run(
            q, gather(k, k_kept, k_pool), gather(v, v_kept, v_pool), return_lse=True
        )
        return o if sinks is None else with_sinks(o, lse, sinks)


_INT_WORKSPACE = "_prefillonly_int_workspace_bytes"  # on a wrapper: the size it was given


def _int_workspace(wrapper, float_workspace: torch.Tensor, size: int) -> None:
    """The wrapper's int workspace (its plans' metadata) replaced by one of `size` bytes
    (FlashInfer's reset_workspace_buffer; the float workspace stays the backend's)."""
    buffer = torch.empty((size,), dtype=torch.uint8, device=float_workspace.device)
    wrapper.reset_workspace_buffer(float_workspace, buffer)
    wrapper.__dict__[_INT_WORKSPACE] = size


def _int_workspace_bytes(wrapper) -> int:
    return wrapper.__dict__.get(_INT_WORKSPACE, FLASHINFER_INT_WORKSPACE_BYTES)


def with_sinks(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention output with per-head sink logits added to its softmax (gpt-oss): a sink
    takes its share of the probability and attends to nothing, so the output shrinks by
    e^lse / (e^lse + e^sink). o: (n, H, Dv); lse: (n, H), FlashInfer's base-2 log-sum-exp
    of the logits (vLLM merges them with is_lse_base_on_e=False); sinks: (H,)."""
    lse = lse.float() * math.log(2.0)
    sink = sinks.to(device=o.device, dtype=torch.float32).view(1, -1)
    keep = torch.exp(lse - torch.logaddexp(lse, sink))
    return (o.float() * keep.unsqueeze(-1)).to(o.dtype)
