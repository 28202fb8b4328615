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

    chunk = FlashInferQueryChunk(plan, spans, prefix_slots, workspace)   # per forward
    out = chunk(q, k_all, v_all, k_pool, v_pool, scale)                  # per layer

Backends as SGLang's FlashInfer backend picks them: the ragged wrapper "auto" (FA3 on
Hopper, FA2 elsewhere), the paged one FA2 (SGLang's prefill_backend). The GPU kit
(scripts/gpu_kit/) carries FA2's sources only, so benchmarks/gpu_prefill.py passes
ragged_backend="fa2".

Not yet run on a GPU (none was lent to the sessions so far); tests/
test_flashinfer_query_chunk.py compares it with a naive attention wherever CUDA and
flashinfer are present, and benchmarks/gpu_prefill.py with float32 attention on a card.
"""

from __future__ import annotations

import torch

from prefillonly_sgl.features.prefill_attention.plan import QueryChunkPlan, Span

PAGED_BACKEND = "fa2"  # SGLang's FlashInferAttnBackend.prefill_backend


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
        """wrappers: FlashInfer wrappers to (re)plan, shared by the chunks of a forward
        (each wrapper holds one plan; a chunk plans them before its run)."""
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

    def _wrapper(self, kind: str):
        import flashinfer

        if kind not in self.wrappers:
            cls = (
                flashinfer.BatchPrefillWithRaggedKVCacheWrapper
                if kind == "ragged"
                else flashinfer.BatchPrefillWithPagedKVCacheWrapper
            )
            self.wrappers[kind] = cls(self.workspace, "NHD", backend=self.backends[kind])
        return self.wrappers[kind]

    def __call__(self, q, k_all, v_all, k_pool, v_pool, scale) -> torch.Tensor:
        """q: (n, H, D) the chunk's queries; k_all / v_all: (T, Hkv, D) the layer's keys,
        rows before the chunk's end computed; k_pool / v_pool: (slots, Hkv, D).
        Returns (n, H, Dv)."""
        from flashinfer import merge_state

        heads, kv_heads, d = q.shape[1], k_all.shape[1], q.shape[2]
        device = q.device
        ragged = self._wrapper("ragged")
        ragged.plan(
            self.qo_indptr.to(device),
            self.kv_indptr.to(device),
            heads,
            kv_heads,
            d,
            causal=True,
            sm_scale=scale,
            q_data_type=q.dtype,
        )
        o, lse = ragged.run(
            q.contiguous(), k_all[self.kv_rows], v_all[self.kv_rows], return_lse=True
        )
        if self.paged is None:
            return o
        indptr, indices, last_page = self.paged
        paged = self._wrapper("paged")
        paged.plan(
            self.qo_indptr.to(device),
            indptr.to(device),
            indices.to(device),
            last_page.to(device),
            heads,
            kv_heads,
            d,
            1,
            causal=False,
            sm_scale=scale,
            q_data_type=q.dtype,
            kv_data_type=k_pool.dtype,
        )
        # page size 1: (slots, 1, Hkv, D) pages
        o_pre, lse_pre = paged.run(
            q.contiguous(), (k_pool.unsqueeze(1), v_pool.unsqueeze(1)), return_lse=True
        )
        merged, _ = merge_state(o, lse, o_pre, lse_pre)
        return merged
