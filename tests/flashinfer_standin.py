"""FlashInfer's prefill wrappers and merge_state in plain torch, float32, for CPU tests of
the code that prepares their inputs (FlashInfer runs on CUDA only). Mocked because it
cannot run here; written from FlashInfer 0.7.2's kernels, not from our code:

- queries are the last positions of their sequence (bottom-right alignment: query i of
  a sequence with n queries and m keys sits at position m - n + i);
- causal: a query sees keys at positions <= its own; non-causal: every key;
- multi-item scoring (prefix_len_ptr given; include/flashinfer/attention/prefill.cuh,
  logits_mask_multi_item_scoring): a query at position p >= prefix_len sees key j <= p
  iff j < prefix_len or p < j + token_pos[p - prefix_len]; below prefix_len, causal;
- paged KV with page size 1: kv_indices name pool slots; pages (slots, 1, Hkv, D);
- log-sum-exps are base 2, as FlashInfer returns them (vLLM merges them with
  is_lse_base_on_e=False), and merge_state merges two base-2 states.

`module()` returns a `flashinfer` module to put in sys.modules.
"""

from __future__ import annotations

import math
import types

import torch

LOG2E = 1.0 / math.log(2.0)


def _attend(q, k, v, allowed, scale):
    """q: (n, H, D); k / v: (m, Hkv, D); allowed: (n, m) bool. (out (n, H, D), lse2 (n, H))."""
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    logits = torch.einsum("nhd,mhd->hnm", q.float(), k) * scale
    logits = logits.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # (H, n)
    probs = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)
    out = torch.einsum("hnm,mhd->nhd", probs, v)
    return out, (lse * LOG2E).transpose(0, 1).contiguous()


def _mask(n_q, n_kv, causal, prefix_len=None, token_pos=None):
    pos = torch.arange(n_kv - n_q, n_kv).unsqueeze(1)  # (n, 1) query positions
    keys = torch.arange(n_kv).unsqueeze(0)
    allowed = keys <= pos if causal else torch.ones(n_q, n_kv, dtype=torch.bool)
    if prefix_len is not None:
        tp = torch.zeros(n_kv, dtype=torch.int64)
        tail = token_pos[: n_kv - prefix_len]
        tp[prefix_len:] = tail
        in_items = pos >= prefix_len
        mine = (keys < prefix_len) | (pos < keys + tp[pos])
        allowed = allowed & (~in_items | mine)
    return allowed


class _Base:
    plans = 0

    def __init__(self, workspace=None, layout="NHD", backend=None, **kwargs) -> None:
        self.backend = backend
        self.planned = None
        self.int_workspace_bytes = 8 << 20  # FlashInfer allocates its own at construction

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        self.int_workspace_bytes = int(int_workspace_buffer.numel())


class PagedWrapper(_Base):
    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        causal=False,
        sm_scale=None,
        logits_soft_cap=None,
        q_data_type=None,
        kv_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        **kwargs,
    ):
        assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu"
        assert page_size == 1
        type(self).plans += 1
        self.planned = dict(
            qo=qo_indptr.tolist(),
            kv=kv_indptr.tolist(),
            indices=kv_indices,
            causal=causal,
            scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim),
            prefix=None if prefix_len_ptr is None else prefix_len_ptr.to(torch.int64).tolist(),
            token_pos=None
            if token_pos_in_items_ptr is None
            else token_pos_in_items_ptr.to(torch.int64),
            stride=token_pos_in_items_len,
            max_item=None if max_item_len_ptr is None else max_item_len_ptr.to(torch.int64),
        )

    def run(self, q, kv_cache, return_lse=False, **kwargs):
        p = self.planned
        k_pages, v_pages = kv_cache
        k_pool, v_pool = k_pages.squeeze(1), v_pages.squeeze(1)
        out = torch.zeros(q.shape, dtype=q.dtype)
        lse = torch.full(q.shape[:2], float("-inf"))
        for i in range(len(p["qo"]) - 1):
            q_lo, q_hi = p["qo"][i], p["qo"][i + 1]
            slots = p["indices"][p["kv"][i] : p["kv"][i + 1]].long()
            n_q, n_kv = q_hi - q_lo, slots.numel()
            if n_q == 0:
                continue
            prefix = token_pos = None
            if p["prefix"] is not None:
                prefix = p["prefix"][i]
                token_pos = p["token_pos"][i * p["stride"] : (i + 1) * p["stride"]]
                longest = int(p["max_item"][i])
                assert int(token_pos.max()) <= longest  # the kernel skips keys by it
            allowed = _mask(n_q, n_kv, p["causal"], prefix, token_pos)
            o, s = _attend(q[q_lo:q_hi], k_pool[slots], v_pool[slots], allowed, p["scale"])
            out[q_lo:q_hi], lse[q_lo:q_hi] = o.to(q.dtype), s
        return (out, lse) if return_lse else out


class RaggedWrapper(_Base):
    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        causal=False,
        sm_scale=None,
        q_data_type=None,
        window_left=-1,
        **kwargs,
    ):
        assert qo_indptr.device.type == "cpu"
        type(self).plans += 1
        self.planned = dict(
            qo=qo_indptr.tolist(),
            kv=kv_indptr.tolist(),
            causal=causal,
            scale=sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim),
        )

    def run(self, q, k, v, return_lse=False, **kwargs):
        p = self.planned
        out = torch.zeros(q.shape, dtype=q.dtype)
        lse = torch.full(q.shape[:2], float("-inf"))
        for i in range(len(p["qo"]) - 1):
            q_lo, q_hi = p["qo"][i], p["qo"][i + 1]
            k_lo, k_hi = p["kv"][i], p["kv"][i + 1]
            allowed = _mask(q_hi - q_lo, k_hi - k_lo, p["causal"])
            o, s = _attend(q[q_lo:q_hi], k[k_lo:k_hi], v[k_lo:k_hi], allowed, p["scale"])
            out[q_lo:q_hi], lse[q_lo:q_hi] = o.to(q.dtype), s
        return (out, lse) if return_lse else out


def merge_state(o1, lse1, o2, lse2):
    """Two attention states over disjoint keys merged (base-2 log-sum-exps)."""
    m = torch.maximum(lse1, lse2)
    w1 = torch.exp2(lse1 - m).nan_to_num(0.0)
    w2 = torch.exp2(lse2 - m).nan_to_num(0.0)
    total = w1 + w2
    out = (o1.float() * w1.unsqueeze(-1) + o2.float() * w2.unsqueeze(-1)) / total.unsqueeze(-1)
    return out.to(o1.dtype), m + torch.log2(total)


def module() -> types.ModuleType:
    flashinfer = types.ModuleType("flashinfer")
    flashinfer.BatchPrefillWithPagedKVCacheWrapper = PagedWrapper
    flashinfer.BatchPrefillWithRaggedKVCacheWrapper = RaggedWrapper
    flashinfer.merge_state = merge_state
    return flashinfer
