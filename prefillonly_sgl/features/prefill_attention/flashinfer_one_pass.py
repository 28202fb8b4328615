"""One paged FlashInfer pass per layer for an extend batch (CUDA path; plain torch +
flashinfer, no SGLang): one_pass.py's plan made into FlashInfer's paged prefill.

    attention = OnePassAttention(plan, write_loc, req_to_token, pool_rows, wrapper)  # per forward
    out = attention(q, k_pool, v_pool, scale)                                       # per layer

Every key is read from the pool: the requests' cached (or borrowed) prefixes through the
request table, the batch's new rows through `write_loc`, where the backend wrote them
before attention (kept rows at their real slots, dropped rows at reserved scratch slots:
scheduler_flashinfer_backend.py). The kv index list is built on the device from host
index arrays copied without blocking (no host-device sync; tests/test_no_host_sync.py),
and the wrapper is planned once per forward, at its first layer (a plan copies its host
arrays to the device; the layers of a forward share it).

A batch with a prefix group runs under the multi-item-scoring mask (one_pass.py); a batch
without one runs FlashInfer's plain causal paged prefill over the same layout.
"""

from __future__ import annotations

import numpy as np
import torch

from prefillonly_sgl.features.prefill_attention.one_pass import OnePassPlan

PAGED_BACKEND = "fa2"  # SGLang's FlashInferAttnBackend.prefill_backend; MIS is FA2's


def kv_index_sources(
    plan: OnePassPlan, pool_rows: list[int], table_width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host arrays of the flat kv index list: (kv offsets of table reads, the flat
    request-table positions they read (row * width + position), kv offsets of the batch's
    new rows in row order). Plain numpy."""
    cached, new_offsets = plan.kv_positions()
    offsets, sources = [], []
    for offset, request, lo, hi in cached:
        offsets.append(np.arange(offset, offset + hi - lo))
        base = pool_rows[request] * table_width
        sources.append(np.arange(base + lo, base + hi))
    empty = np.zeros(0, dtype=np.int64)
    return (
        np.concatenate(offsets) if offsets else empty,
        np.concatenate(sources) if sources else empty,
        new_offsets.astype(np.int64),
    )


def _to_device(array: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(dtype).to(device, non_blocking=True)


class OnePassAttention:
    def __init__(
        self,
        plan: OnePassPlan,
        write_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        pool_rows: list[int],
        wrapper,
    ) -> None:
        """write_loc: (new rows,) the pool slot each new row's k / v is written to;
        req_to_token: SGLang's request table (rows, width), on the device; pool_rows: the
        batch's requests' rows in it, from the host; wrapper: a FlashInfer
        BatchPrefillWithPagedKVCacheWrapper this forward plans."""
        self.plan = plan
        self.wrapper = wrapper
        device = write_loc.device
        table_offsets, table_sources, new_offsets = kv_index_sources(
            plan, pool_rows, req_to_token.shape[1]
        )
        kv_indices = torch.empty(plan.kv_indptr[-1], dtype=torch.int32, device=device)
        kv_indices.index_copy_(
            0, _to_device(new_offsets, torch.int64, device), write_loc.to(torch.int32)
        )
        if len(table_offsets):
            read = req_to_token.view(-1).index_select(
                0, _to_device(table_sources, torch.int64, device)
            )
            kv_indices.index_copy_(
                0, _to_device(table_offsets, torch.int64, device), read.to(torch.int32)
            )
        self.kv_indices = kv_indices
        self.qo_indptr = torch.tensor(plan.qo_indptr, dtype=torch.int32)
        self.kv_indptr = torch.tensor(plan.kv_indptr, dtype=torch.int32)
        self.last_page_len = torch.ones(len(plan.sequences), dtype=torch.int32)
        self.items = None
        if plan.grouped:
            # FlashInfer's multi-item-scoring arrays (uint32 / uint16, on the device)
            self.items = dict(
                prefix_len_ptr=_to_device(np.asarray(plan.prefix_lens()), torch.uint32, device),
                token_pos_in_items_ptr=_to_device(plan.token_pos(), torch.uint16, device),
                token_pos_in_items_len=plan.token_pos_len(),
                max_item_len_ptr=_to_device(np.asarray(plan.max_item_lens()), torch.uint16, device),
            )
        self._planned = None

    def __call__(self, q, k_pool, v_pool, scale: float, logits_soft_cap: float = 0.0):
        """q: (rows, H, D) (rows may exceed the plan's: a CUDA graph's padding, left
        unwritten); k_pool / v_pool: (slots, Hkv, D). Returns (rows, H, Dv)."""
        heads, kv_heads, d = q.shape[1], k_pool.shape[1], q.shape[2]
        args = (heads, kv_heads, d, scale, logits_soft_cap, q.dtype, k_pool.dtype)
        if self._planned != args:
            self.wrapper.plan(
                self.qo_indptr,
                self.kv_indptr,
                self.kv_indices,
                self.last_page_len,
                heads,
                kv_heads,
                d,
                1,
                causal=True,
                sm_scale=scale,
                logits_soft_cap=logits_soft_cap or None,
                q_data_type=q.dtype,
                kv_data_type=k_pool.dtype,
                non_blocking=True,
                **(self.items or {}),
            )
            self._planned = args
        # page size 1: (slots, 1, Hkv, D) pages
        return self.wrapper.run(q.contiguous(), (k_pool.unsqueeze(1), v_pool.unsqueeze(1)))
