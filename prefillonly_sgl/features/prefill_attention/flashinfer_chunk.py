"""Attention of one query chunk of an extend batch with FlashInfer (CUDA path; plain torch +
flashinfer, no SGLang). The GPU counterpart of query_chunk.py, for decoder layers run in
query chunks (features/hybrid_prefill/layer_chunks.py).

The chunk's requests (plan.plan_query_chunk: the head, which began before the chunk, and
the rest) are consecutive in the batch, so their own keys are one run of rows of the
layer's whole K / V: [first row of the first piece, chunk end). That run is FlashInfer's
ragged KV with kv_indptr at each piece's first own row, and qo_indptr at each piece's first
query in the chunk; FlashInfer's causal mask is aligned bottom-right (query i of a piece
with n queries and m keys sees keys up to m - n + i), which is exactly "earlier own
tokens, then causal within the chunk". The cached prefixes are a paged KV over the pool
(page size 1, the request's slots), attended without a mask, and the two parts are merged
by their log-sum-exps (flashinfer.merge_state): SGLang's own ragged + paged extend,
restricted to a query range.

    chunk = FlashInferQueryChunk(plan, spans, prefix_slots, workspace, wrappers)  # per forward
    out = chunk(q, k_all, v_all, k_pool, v_pool, scale)                           # per layer

A chunk plans its FlashInfer wrappers once per forward, at its first layer, and its other
layers only run: a plan reads its index arrays on the host and copies them to the device,
so planning per layer (as this did until 2026-11-27) cost every layer of every chunk a
plan. The index arrays stay on the host (FlashInfer reads them there; a device copy would
make it wait for the device to copy them back). `wrappers` belong to the chunk's position
in the forward (the backend keeps them across forwards: a wrapper allocates its own
workspace), so no two chunks of a forward share a plan.

Sliding windows and attention sinks (gpt-oss; the CPU kernels' windowed.py): FlashInfer's
`window_left` counts positions from its bottom-right alignment, which is right for the
ragged part (the piece's keys end at its last query) but not for the paged prefix planned
non-causal (there FlashInfer would place the queries at the prefix's end). So with a window
or sinks each piece's keys are gathered into one ragged run that ends at its last query:
the prefix keys the window reaches (from the pool), then its own keys; one causal ragged
call with window_left, and the sinks applied from its log-sum-exp. FlashInfer returns
base-2 log-sum-exps (vLLM merges them with is_lse_base_on_e=False), so the sink's share is
computed from lse * ln 2. Not run on a GPU (none was lent to this work):
tests/test_flashinfer_query_chunk.py checks the gathered rows on CPU and the values
wherever CUDA and flashinfer are present.

Backends as SGLang's FlashInfer backend picks them: the ragged wrapper "auto" (FA3 on
Hopper, FA2 elsewhere), the paged one FA2 (SGLang's prefill_backend). The GPU kit
(scripts/gpu_kit/) carries FA2's sources only, so benchmarks/gpu_prefill.py passes
ragged_backend="fa2".

Not yet run on a GPU (none was lent to the sessions so far); tests/
test_flashinfer_query_chunk.py compares it with a naive attention wherever CUDA and
flashinfer are present, and benchmarks/gpu_prefill.py with float32 attention on a card.
"""

from __future__ import annotations

import math

import torch

from prefillonly_sgl.features.prefill_attention.plan import QueryChunkPlan, Span

PAGED_BACKEND = "fa2"  # SGLang's FlashInferAttnBackend.prefill_backend
# On a wrapper: (the chunk, the plan's arguments) of the plan it holds.
_PLAN_OWNER = "_prefillonly_plan_owner"


def chunk_pieces(plan: QueryChunkPlan, spans: list[Span]) -> list[tuple[int, int, int, int, int]]:
    """Per request in the chunk, in batch order: (request, chunk-local first query, query
    count, first own key row in the layer's K / V, own key count). Plain Python."""
    pieces = []
    if plan.head is not None:
        first = spans[plan.head].q_start
        pieces.append((plan.head, 0, plan.head_rows, first, plan.head_before + plan.head_rows))
    for i, local in plan.rest:
        pieces.append((i, local.q_start, local.n_new, plan.start + local.q_start, local.n_new))
    return pieces


def windowed_keys(
    plan: QueryChunkPlan, spans: list[Span], window: int | None
) -> list[tuple[int, int, int, int]]:
    """Per piece (chunk_pieces' order): (prefix key from, prefix key to, own key row from,
    own key row to) that its queries can see: the prefix positions [from, to) and the
    layer's own-key rows [from, to), ending at the piece's last query. Plain Python."""
    keys = []
    for i, _, n_q, first_row, n_kv in chunk_pieces(plan, spans):
        p = spans[i].prefix_len
        first_q = p + n_kv - n_q  # position of the piece's first query
        lo = 0 if window is None else max(0, first_q - window)
        keys.append((min(lo, p), p, first_row + max(0, lo - p), first_row + n_kv))
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
    ) -> None:
        """wrappers: this chunk position's FlashInfer wrappers, by kind (created here when
        missing; each holds one plan, which this chunk makes at its first layer)."""
        self.backends = {"ragged": ragged_backend, "paged": PAGED_BACKEND}
        pieces = chunk_pieces(plan, spans)
        self.kv_rows = slice(pieces[0][3], pieces[-1][3] + pieces[-1][4])
        qo, kv = [0], [0]
        for _, _, n_q, _, n_kv in pieces:
            qo.append(qo[-1] + n_q)
            kv.append(kv[-1] + n_kv)
        self.qo_indptr = torch.tensor(qo, dtype=torch.int32)
        self.kv_indptr = torch.tensor(kv, dtype=torch.int32)
        slots = [prefix_slots[i] for i, *_ in pieces]
        lens = [0 if s is None else int(s.numel()) for s in slots]
        self.paged = None
        if any(lens):
            indptr = [0]
            for n in lens:
                indptr.append(indptr[-1] + n)
            self.paged = (
                torch.tensor(indptr, dtype=torch.int32),
                torch.cat([s.to(torch.int32) for s in slots if s is not None and s.numel()]),
                torch.ones(len(pieces), dtype=torch.int32),
            )
        self.workspace = workspace
        self.wrappers = wrappers if wrappers is not None else {}
        self._plan, self._spans, self._slots = plan, spans, slots
        self._windowed: dict = {}  # window -> (kv_indptr, gather index pieces)

    def _wrapper(self, key):
        """The wrapper for `key` ("ragged" / "paged", or ("ragged", window)), made once."""
        if key not in self.wrappers:
            import flashinfer

            kind = key if isinstance(key, str) else key[0]
            cls = (
                flashinfer.BatchPrefillWithRaggedKVCacheWrapper
                if kind == "ragged"
                else flashinfer.BatchPrefillWithPagedKVCacheWrapper
            )
            self.wrappers[key] = cls(self.workspace, "NHD", backend=self.backends[kind])
        return self.wrappers[key]

    def planned(self, key, args: tuple, plan) -> object:
        """The wrapper for `key`, planned by plan(wrapper) unless this chunk planned it
        with the same `args` (head counts, dims, scale, dtypes) already: the layers of a
        forward share the chunk's plan; a layer of another shape replans."""
        wrapper = self._wrapper(key)
        # A wrapper holds the last plan made on it: shared with another chunk (a caller's
        # one dict for all), it is replanned whenever the other chunk planned it since.
        if wrapper.__dict__.get(_PLAN_OWNER) != (self, args):
            plan(wrapper)
            wrapper.__dict__[_PLAN_OWNER] = (self, args)
        return wrapper

    def __call__(
        self, q, k_all, v_all, k_pool, v_pool, scale, window=None, sinks=None
    ) -> torch.Tensor:
        """q: (n, H, D) the chunk's queries; k_all / v_all: (T, Hkv, D) the layer's keys,
        rows before the chunk's end computed; k_pool / v_pool: (slots, Hkv, D); window:
        SGLang's sliding_window_size (None: full); sinks: (H,) sink logits.
        Returns (n, H, Dv)."""
        if window is not None or sinks is not None:
            return self._gathered(q, k_all, v_all, k_pool, v_pool, scale, window, sinks)
        heads, kv_heads, d = q.shape[1], k_all.shape[1], q.shape[2]
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
        o, lse = ragged.run(
            q.contiguous(), k_all[self.kv_rows], v_all[self.kv_rows], return_lse=True
        )
        if self.paged is None:
            return o
        from flashinfer import merge_state

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
        o_pre, lse_pre = paged.run(
            q.contiguous(), (k_pool.unsqueeze(1), v_pool.unsqueeze(1)), return_lse=True
        )
        merged, _ = merge_state(o, lse, o_pre, lse_pre)
        return merged

    def _gathered(self, q, k_all, v_all, k_pool, v_pool, scale, window, sinks):
        """One causal ragged call over each piece's visible keys gathered (module docstring)."""
        device = q.device
        if window not in self._windowed:
            indptr, parts = [0], []
            for slots, (p_lo, p_hi, r_lo, r_hi) in zip(
                self._slots, windowed_keys(self._plan, self._spans, window)
            ):
                pool_rows = slots[p_lo:p_hi].long() if p_hi > p_lo else None
                parts.append((pool_rows, r_lo, r_hi))
                indptr.append(indptr[-1] + (p_hi - p_lo) + (r_hi - r_lo))
            self._windowed[window] = (torch.tensor(indptr, dtype=torch.int32), parts)
        kv_indptr, parts = self._windowed[window]

        def gather(own, pool):
            pieces = []
            for pool_rows, r_lo, r_hi in parts:
                if pool_rows is not None:
                    pieces.append(pool.index_select(0, pool_rows.to(device)).to(own.dtype))
                pieces.append(own[r_lo:r_hi])
            return torch.cat(pieces)

        heads, kv_heads, d = q.shape[1], k_all.shape[1], q.shape[2]
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
        o, lse = ragged.run(
            q.contiguous(), gather(k_all, k_pool), gather(v_all, v_pool), return_lse=True
        )
        return o if sinks is None else with_sinks(o, lse, sinks)


def with_sinks(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention output with per-head sink logits added to its softmax (gpt-oss): a sink
    takes its share of the probability and attends to nothing, so the output shrinks by
    e^lse / (e^lse + e^sink). o: (n, H, Dv); lse: (n, H), FlashInfer's base-2 log-sum-exp
    of the logits (vLLM merges them with is_lse_base_on_e=False); sinks: (H,)."""
    lse = lse.float() * math.log(2.0)
    sink = sinks.to(device=o.device, dtype=torch.float32).view(1, -1)
    keep = torch.exp(lse - torch.logaddexp(lse, sink))
    return (o.float() * keep.unsqueeze(-1)).to(o.dtype)
