"""Sliding windows and attention sinks for the CPU kernels (plain torch, no SGLang).

gpt-oss alternates sliding-window and full layers and gives every head a learned sink:

- window: SGLang's `layer.sliding_window_size` (torch_native's mask, which these kernels
  keep exactly): the query at position t sees the keys at positions t - window .. t.
  gpt-oss's Hugging Face `sliding_window` W is window W - 1 (models/gpt_oss.py). None: a
  full layer.
- sinks: (H,) logits that join each row's softmax denominator and carry no value,
      out = sum_j e^(s_j) v_j / (e^sink + sum_j e^(s_j)) = o * e^(lse - logaddexp(lse, sink))
  with o the row's ordinary output and lse its log-sum-exp. So a part that returns its
  output and log-sum-exp (PyTorch's fused CPU attention does) takes the sink afterwards,
  after any merge of parts: the sink is one more part of the merge, without a value.

Every attention here is a fused call with a boolean "visible" mask from the rows' and keys'
positions, and keys cut to what a window can reach (a sliding layer's query block reads
at most window + block keys, never the whole prefix).
"""

from __future__ import annotations

import torch

# PyTorch's fused CPU attention with each row's log-sum-exp (see cpu_extend.FLASH_WITH_LSE).
FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(n, m) bool: key k_pos[j] is seen by query q_pos[i] (causal, within the window)."""
    rel = q_pos.unsqueeze(1) - k_pos.unsqueeze(0)  # how far back the key is
    seen = rel >= 0
    if window is not None:
        seen &= rel <= window
    return seen


def first_key(q_first: int, window: int | None) -> int:
    """The earliest key position any query at or after q_first can see."""
    return 0 if window is None else max(0, q_first - window)


def attend(q, k, v, seen, scale):
    """q (n, H, D) against k / v (m, Hkv, D): (n, H, Dv) output and (n, H) log-sum-exp,
    masked by `seen` (n, m) bool or unmasked (None). Rows that see no key get output 0 and
    log-sum-exp -inf (they add nothing to a merge). The G query heads of a KV head go in
    stacked as one query block (no GQA expansion of K / V), the mask's rows repeated."""
    n, heads, d = q.shape
    kv_heads = k.shape[1]
    g = heads // kv_heads
    if n == 0 or k.shape[0] == 0:
        return (
            q.new_zeros((n, heads, v.shape[2])),
            torch.full((n, heads), float("-inf"), dtype=torch.float32, device=q.device),
        )
    stacked = q.reshape(n, kv_heads, g, d).permute(1, 2, 0, 3).reshape(1, kv_heads, g * n, d)
    if seen is not None and bool(seen.all()):
        seen = None  # every key visible (a full layer's prefix part): no mask to build
    mask = None
    if seen is not None:
        mask = torch.zeros(seen.shape, dtype=q.dtype, device=q.device)
        mask.masked_fill_(~seen, float("-inf"))
        mask = mask.repeat(g, 1)  # rows in stacked order: head-in-group major, then row
    o, lse = FLASH_WITH_LSE(
        stacked,
        k.transpose(0, 1).unsqueeze(0).to(q.dtype),
        v.transpose(0, 1).unsqueeze(0).to(q.dtype),
        attn_mask=mask,
        scale=scale,
    )[:2]
    o = o.view(kv_heads, g, n, -1).permute(2, 0, 1, 3).reshape(n, heads, -1)
    lse = lse.view(kv_heads, g, n).permute(2, 0, 1).reshape(n, heads).float()
    if seen is not None:
        blind = ~seen.any(dim=1)
        if bool(blind.any()):
            o = o.masked_fill(blind.view(n, 1, 1), 0.0)
            lse = lse.masked_fill(blind.view(n, 1), float("-inf"))
    return o, lse


def merge(parts):
    """Softmax over the union of the parts' keys from each part's (output, log-sum-exp):
    (sum_i o_i * exp(lse_i - lse), lse), in float32."""
    if len(parts) == 1:
        return parts[0][0].float(), parts[0][1]
    lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    merged = None
    for o, part_lse in parts:
        w = torch.exp(part_lse - lse).nan_to_num_(0.0)  # a part no row sees: weight 0
        weighted = o.float() * w.unsqueeze(-1)
        merged = weighted if merged is None else merged.add_(weighted)
    return merged, lse


def with_sinks(o, lse, sinks):
    """o (n, H, Dv) with each head's sink logit added to its softmax denominator."""
    if sinks is None:
        return o
    sink = sinks.to(device=o.device, dtype=torch.float32).view(1, -1)
    keep = torch.exp(lse - torch.logaddexp(lse, sink))  # e^lse / (e^lse + e^sink)
    return o.float() * keep.unsqueeze(-1)


def attend_request(
    q, k_new, v_new, k_pool, v_pool, prefix_slots, prefix_len, scale, window, sinks, block
):
    """One request's new rows (n, H, D) against its cached prefix (pool slots) and its own
    new k / v, causal, in query blocks of `block` rows: (n, H, Dv) in float32."""
    n = q.shape[0]
    out = torch.empty((n, q.shape[1], v_new.shape[2]), dtype=torch.float32, device=q.device)
    for a in range(0, n, block):
        b = min(n, a + block)
        lo = first_key(prefix_len + a, window)  # first key position this block can see
        q_pos = torch.arange(prefix_len + a, prefix_len + b, device=q.device)
        parts = []
        if lo < prefix_len:
            slots = prefix_slots[lo:prefix_len]
            k_pos = torch.arange(lo, prefix_len, device=q.device)
            parts.append(
                attend(
                    q[a:b],
                    k_pool.index_select(0, slots),
                    v_pool.index_select(0, slots),
                    visible(q_pos, k_pos, window),
                    scale,
                )
            )
        own_lo = max(0, lo - prefix_len)
        k_pos = torch.arange(prefix_len + own_lo, prefix_len + b, device=q.device)
        parts.append(
            attend(q[a:b], k_new[own_lo:b], v_new[own_lo:b], visible(q_pos, k_pos, window), scale)
        )
        o, lse = merge(parts)
        out[a:b] = with_sinks(o, lse, sinks)
    return out
