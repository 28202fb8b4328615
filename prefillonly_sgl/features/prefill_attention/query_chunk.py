"""Attention of one query chunk of an extend batch (CPU path, plain torch, no SGLang).

A decoder layer run in query chunks (features/hybrid_prefill/layer_chunks.py) computes the
attention of the batch's rows [start, end) once the k / v of every row before `end` are in its whole
per-layer buffers. plan.plan_query_chunk says which request is where:

- the requests whose new tokens begin in the chunk are an ordinary extend batch of the
  chunk's rows (their own keys all lie in it): ExtendAttention, with its batching and
  shared-prefix groups;
- the one request that began before the chunk (the "head": a long prompt's later chunks)
  attends to three sets of keys: its cached prefix in the pool, its own earlier new
  tokens (in the layer's buffers), and the chunk's own tokens (causal). Each is one fused
  call returning its log-sum-exp, merged exactly; no mask and no copy of the earlier keys
  (a mask over 30k keys, or keys gathered into one tensor, would be as large as what the
  chunking saves).

    chunk = QueryChunkAttention(plan, spans, prefix_slots)           # once per forward
    out = chunk(q, k_all, v_all, k_pool, v_pool, scale)              # once per layer
"""

from __future__ import annotations

import torch

from prefillonly_sgl.features.prefill_attention import windowed
from prefillonly_sgl.features.prefill_attention.cpu_extend import FLASH_WITH_LSE, ExtendAttention
from prefillonly_sgl.features.prefill_attention.plan import (
    DEFAULT_LIMITS,
    Limits,
    QueryChunkPlan,
    Span,
)


def query_chunks_supported() -> bool:
    """The head's three parts need the fused kernel's log-sum-exp (torch >= 2.2)."""
    return FLASH_WITH_LSE is not None


class QueryChunkAttention:
    def __init__(
        self,
        plan: QueryChunkPlan,
        spans: list[Span],
        prefix_slots: list,
        device="cpu",
        limits: Limits = DEFAULT_LIMITS,
        shared_prefix: bool = True,
    ) -> None:
        if not query_chunks_supported():
            raise RuntimeError("query-chunked attention needs torch's fused CPU attention")
        self.plan = plan
        self.head_first_row = None
        self.head_slots = None
        if plan.head is not None:
            head = spans[plan.head]
            self.head_first_row = head.q_start
            slots = prefix_slots[plan.head]
            if head.prefix_len and slots is not None:
                self.head_slots = slots.to(device=device, dtype=torch.long)
        self.rest = None
        if plan.rest:
            self.rest = ExtendAttention(
                [span for _, span in plan.rest],
                [prefix_slots[i] for i, _ in plan.rest],
                device=device,
                limits=limits,
                shared_prefix=shared_prefix,
            )

    def __call__(
        self,
        q: torch.Tensor,  # (end - start, H, D): the chunk's queries
        k_all: torch.Tensor,  # (T, Hkv, D): the batch's keys, rows before `end` computed
        v_all: torch.Tensor,  # (T, Hkv, Dv)
        k_pool: torch.Tensor,  # (slots, Hkv, D)
        v_pool: torch.Tensor,
        scale: float | None,
        window: int | None = None,  # a sliding layer's window (windowed.py); None: full
        sinks: torch.Tensor | None = None,  # (H,) attention-sink logits (gpt-oss)
    ) -> torch.Tensor:
        """(end - start, H, Dv) attention output of the chunk's rows."""
        start, end = self.plan.start, self.plan.end
        k_chunk, v_chunk = k_all[start:end], v_all[start:end]  # rows aligned with q
        extra = {"window": window, "sinks": sinks}
        if self.plan.head is None:
            return self.rest(q, k_chunk, v_chunk, k_pool, v_pool, scale, **extra)
        out = q.new_empty((q.shape[0], q.shape[1], v_all.shape[2]))
        rows = self.plan.head_rows
        if window is None and sinks is None:
            self._head(q[:rows], k_all, v_all, k_pool, v_pool, scale, out[:rows])
        else:
            self._head_windowed(q[:rows], k_all, v_all, k_pool, v_pool, scale, out[:rows], **extra)
        if self.rest is not None:
            self.rest(q, k_chunk, v_chunk, k_pool, v_pool, scale, out=out, **extra)
        return out

    def _head_windowed(self, q, k_all, v_all, k_pool, v_pool, scale, out, window, sinks):
        """_head with a window and / or sinks: the same three parts, masked by position
        (the head's j-th row in the chunk is at position P + before + j) and cut to the keys
        the window reaches, merged, then the sinks."""
        start, n = self.plan.start, q.shape[0]
        first, before = self.head_first_row, self.plan.head_before
        p = 0 if self.head_slots is None else int(self.head_slots.numel())
        q_pos = torch.arange(p + before, p + before + n, device=q.device)
        lo = windowed.first_key(p + before, window)  # earliest key position any row sees
        parts = []
        if lo < p:
            slots = self.head_slots[lo:]
            k_pos = torch.arange(lo, p, device=q.device)
            k_pre = k_pool.index_select(0, slots)
            v_pre = v_pool.index_select(0, slots)
            parts.append(
                windowed.attend(q, k_pre, v_pre, windowed.visible(q_pos, k_pos, window), scale)
            )
        own_lo = max(0, lo - p)  # earlier own keys, from the first one the window reaches
        if own_lo < before:
            k_pos = torch.arange(p + own_lo, p + before, device=q.device)
            rows = slice(first + own_lo, start)
            seen = windowed.visible(q_pos, k_pos, window)
            parts.append(windowed.attend(q, k_all[rows], v_all[rows], seen, scale))
        rows = slice(start, start + n)
        parts.append(
            windowed.attend(
                q, k_all[rows], v_all[rows], windowed.visible(q_pos, q_pos, window), scale
            )
        )
        o, lse = windowed.merge(parts)
        out.copy_(windowed.with_sinks(o, lse, sinks))

    def _head(self, q, k_all, v_all, k_pool, v_pool, scale, out) -> None:
        """The head request's rows: prefix (pool) + earlier own keys + causal own chunk."""
        start, n = self.plan.start, q.shape[0]
        parts = []
        if self.head_slots is not None:
            k_pre = k_pool.index_select(0, self.head_slots).to(q.dtype)
            v_pre = v_pool.index_select(0, self.head_slots).to(q.dtype)
            parts.append(_unmasked(q, k_pre, v_pre, scale))
        first = self.head_first_row
        parts.append(_unmasked(q, k_all[first:start], v_all[first:start], scale))
        parts.append(_causal(q, k_all[start : start + n], v_all[start : start + n], scale))
        _merge(parts, out)


def _unmasked(q, k, v, scale):
    """(N, H, Dv) output and (N, H) log-sum-exp of q against every key. The G query heads
    of a KV head go in as one stacked query block (the kernel's best case, no GQA
    expansion)."""
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    stacked = q.reshape(n, kv_heads, g, d).permute(1, 2, 0, 3).reshape(1, kv_heads, g * n, d)
    o, lse = FLASH_WITH_LSE(
        stacked, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), scale=scale
    )[:2]
    o = o.view(kv_heads, g, n, -1).permute(2, 0, 1, 3).reshape(n, heads, -1)
    return o, lse.view(kv_heads, g, n).permute(2, 0, 1).reshape(n, heads)


def _causal(q, k, v, scale):
    """(N, H, Dv) and (N, H): q against the same N rows' keys, top-left causal."""
    o, lse = FLASH_WITH_LSE(
        q.transpose(0, 1).unsqueeze(0).contiguous(),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        is_causal=True,
        scale=scale,
    )[:2]
    return o[0].transpose(0, 1), lse[0].transpose(0, 1)


def _merge(parts, out) -> None:
    """Softmax over the union of the parts' keys, from each part's normalised output and
    log-sum-exp: sum_i o_i * exp(lse_i - lse)."""
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    merged = None
    for o, part_lse in parts:
        weighted = o.float() * torch.exp(part_lse - lse).unsqueeze(-1)
        merged = weighted if merged is None else merged.add_(weighted)
    out.copy_(merged)
