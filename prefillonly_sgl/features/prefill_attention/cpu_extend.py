"""Attention of an extend batch's new tokens with PyTorch's fused SDPA (CPU path).

Plain torch, no SGLang: the KV pool is just a pair of (slots, kv_heads, head_dim)
tensors and each request's cached prefix a tensor of slot indices, so it is tested
against a naive attention on random tensors (tests/test_prefill_attention_kernel.py).

    attention = ExtendAttention(spans, prefix_slots)   # once per forward batch
    out = attention(q, k, v, k_pool, v_pool, scale)     # once per layer (or out=...)

Per request, queries are only the new tokens; keys and values are the cached prefix
gathered from the pool followed by the new k / v in hand (never read back from the
pool). Grouped-query heads go to SDPA as they are (enable_gqa: K/V are not repeated in
memory). What runs as which call is decided by plan.py; requests behind one shared
cached prefix run as a SharedPrefixGroup (prefix part once, own parts, log-sum-exp merge).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefillonly_sgl.features.prefill_attention import windowed
from prefillonly_sgl.features.prefill_attention.plan import (
    DEFAULT_LIMITS,
    Group,
    Limits,
    MaskKind,
    SharedPrefixGroup,
    Span,
    plan_groups,
    plan_query_blocks,
    plan_shared_prefix,
)

# PyTorch's fused CPU attention, which also returns each query row's log-sum-exp (what
# merging two parts of one softmax needs). Private but stable since torch 2.2; without
# it requests behind a shared prefix run as before (padded groups).
FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def tail_mask(n_queries: int, n_keys: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(n_queries, n_keys) additive mask: query i sees keys [0, n_keys - n_queries + i]."""
    mask = torch.zeros((n_queries, n_keys), dtype=dtype, device=device)
    mask[:, n_keys - n_queries :] = _upper_triangle(n_queries, dtype, device)
    return mask


def _upper_triangle(n: int, dtype, device) -> torch.Tensor:
    """(n, n): 0 on and below the diagonal, -inf above it."""
    return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu_(1)


class _PaddedGroup:
    """Index tensors that scatter a group's requests into one padded SDPA call."""

    def __init__(self, group: Group, spans: list[Span], prefix_slots, device) -> None:
        self.group = group
        self.spans = [spans[j] for j in group.members]
        q_src, q_dst, pre_src, pre_dst, new_src, new_dst = [], [], [], [], [], []
        for r, span in enumerate(self.spans):
            rows = torch.arange(span.q_start, span.q_start + span.n_new, device=device)
            q_src.append(rows)
            q_dst.append(torch.arange(span.n_new, device=device) + r * group.n_max)
            kv_base = r * group.kv_max
            if span.prefix_len:
                pre_src.append(prefix_slots[group.members[r]].to(device=device, dtype=torch.long))
                pre_dst.append(torch.arange(span.prefix_len, device=device) + kv_base)
            new_src.append(rows)
            new_dst.append(torch.arange(span.prefix_len, span.kv_len, device=device) + kv_base)
        self.q_src = torch.cat(q_src)
        self.q_dst = torch.cat(q_dst)
        self.prefix_src = torch.cat(pre_src) if pre_src else None
        self.prefix_dst = torch.cat(pre_dst) if pre_dst else None
        self.new_src = torch.cat(new_src)
        self.new_dst = torch.cat(new_dst)
        self._masks: dict[tuple, torch.Tensor] = {}

    def mask(self, dtype, device, groups: int = 1) -> torch.Tensor:
        """(R, 1, groups * n_max, kv_max): each request's tail mask (rows repeated `groups`
        times for stacked heads), padded keys hidden; padded query rows see every key
        (their output is discarded, this only avoids NaN)."""
        if (dtype, groups) not in self._masks:
            g = self.group
            mask = torch.full((len(self.spans), g.n_max, g.kv_max), float("-inf"), dtype=dtype)
            for r, span in enumerate(self.spans):
                mask[r, : span.n_new, : span.kv_len] = tail_mask(
                    span.n_new, span.kv_len, dtype, "cpu"
                )
                mask[r, span.n_new :, :] = 0
            self._masks[dtype, groups] = mask.repeat(1, groups, 1).unsqueeze(1).to(device)
        return self._masks[dtype, groups]


class ExtendAttention:
    """Attention of one extend batch; built once per forward and reused by every layer.

    spans: one per request, in batch order (rows of q / k / v are the concatenated new
        tokens of all requests).
    prefix_slots: per request, the pool slots of its cached prefix (prefix_len long), or
        None when prefix_len == 0.
    shared_prefix: requests behind the same prefix slots run as shared-prefix groups
        (False: each on its own, for A/B measurements).
    """

    def __init__(
        self,
        spans: list[Span],
        prefix_slots: list,
        device="cpu",
        limits: Limits = DEFAULT_LIMITS,
        shared_prefix: bool = True,
    ) -> None:
        self.spans = spans
        self.prefix_slots = prefix_slots
        self.stack_heads_below = limits.stack_heads_below
        self.min_block, self.max_block_mask = limits.min_block, limits.max_block_mask
        self.shared: list[_SharedGroup] = []
        others = list(range(len(spans)))
        if shared_prefix and FLASH_WITH_LSE is not None and torch.device(device).type == "cpu":
            others, shared = plan_shared_prefix(spans, _prefix_keys(prefix_slots), limits)
            self.shared = [_SharedGroup(g, spans, prefix_slots, device) for g in shared]
        rest = [spans[i] for i in others]
        alone, groups = plan_groups(rest, limits)
        self.alone = [
            (others[i], plan_query_blocks(rest[i].prefix_len, rest[i].n_new, limits)) for i in alone
        ]
        self.groups = [
            _PaddedGroup(
                Group(tuple(others[j] for j in g.members), g.n_max, g.kv_max),
                spans,
                prefix_slots,
                device,
            )
            for g in groups
        ]
        self._tail_masks: dict[tuple, torch.Tensor] = {}

    def __call__(
        self,
        q: torch.Tensor,  # (T, H, D) queries of the new tokens
        k: torch.Tensor,  # (T, Hkv, D) keys of the new tokens
        v: torch.Tensor,  # (T, Hkv, Dv)
        k_pool: torch.Tensor,  # (slots, Hkv, D)
        v_pool: torch.Tensor,  # (slots, Hkv, Dv)
        scale: float | None,
        out: torch.Tensor | None = None,  # (T, H, Dv), written in place when given
        window: int | None = None,  # a sliding layer's window (windowed.py); None: full
        sinks: torch.Tensor | None = None,  # (H,) attention-sink logits (gpt-oss)
    ) -> torch.Tensor:
        """(T, H, Dv) attention output. Without `out`, a batch that is one SDPA call (one
        request in one query block: a cold prompt, or a long item alone) returns the
        kernel's own output as it is (laid out (N, H, Dv) underneath): no second
        (T, H, Dv) buffer and no copy, which matters for long prompts.

        A window or sinks (windowed.py) run every request through masked fused calls
        that return their log-sum-exps; shared-prefix groups stay groups (the prefix
        gathered and attended once, merged with each member's own part)."""
        if window is not None or sinks is not None:
            return self._windowed(q, k, v, k_pool, v_pool, scale, out, window, sinks)
        gqa = q.shape[1] != k.shape[1]
        if out is None:
            single = self._single_call()
            if single is not None:
                return self._run_alone(*single, q, k, v, k_pool, v_pool, scale, gqa, None)
            out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        for i, blocks in self.alone:
            self._run_alone(i, blocks, q, k, v, k_pool, v_pool, scale, gqa, out)
        for group in self.groups:
            self._run_group(group, q, k, v, k_pool, v_pool, scale, gqa, out)
        for shared in self.shared:
            shared.run(q, k, v, k_pool, v_pool, scale, out)
        return out

    def _windowed(self, q, k, v, k_pool, v_pool, scale, out, window, sinks):
        if out is None:
            out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        # Padded groups exist to batch small requests into one call; with a window's or
        # sinks' masks each request runs on its own (the same math, fewer shapes).
        singles = [i for i, _ in self.alone] + [j for g in self.groups for j in g.group.members]
        g = q.shape[1] // k.shape[1]
        for i in singles:
            span = self.spans[i]
            # query blocks whose masks stay within the plan's bound; a sliding layer's
            # block sees at most window + block keys
            # (the mask's rows are repeated for the G query heads of a KV head)
            keys = span.kv_len if window is None else min(span.kv_len, window + 1 + self.min_block)
            block = max(self.min_block, self.max_block_mask // max(1, keys * g))
            rows = slice(span.q_start, span.q_start + span.n_new)
            slots = self.prefix_slots[i]
            if slots is not None:
                slots = slots.to(device=q.device, dtype=torch.long)
            o = windowed.attend_request(
                q[rows], k[rows], v[rows], k_pool, v_pool, slots, span.prefix_len,
                scale, window, sinks, block,
            )  # fmt: skip
            out[rows] = o.to(out.dtype)
        for shared in self.shared:
            shared.run_windowed(q, k, v, k_pool, v_pool, scale, out, window, sinks)
        return out

    def _single_call(self):
        """(request, blocks) when the whole batch is one unstacked SDPA call, else None."""
        if self.groups or self.shared or len(self.alone) != 1:
            return None
        i, blocks = self.alone[0]
        span = self.spans[i]
        if len(blocks) != 1 or span.q_start != 0:
            return None
        b = blocks[0]
        stacked = b.mask is not MaskKind.CAUSAL and b.q_end - b.q_start < self.stack_heads_below
        return None if stacked else (i, blocks)

    # -- one request, query blocks ---------------------------------------------------------
    def _run_alone(self, i, blocks, q, k, v, k_pool, v_pool, scale, gqa, out):
        """Writes into `out`; with out=None (a single unstacked block, see _single_call)
        returns the kernel's output as (N, H, Dv)."""
        span = self.spans[i]
        rows = slice(span.q_start, span.q_start + span.n_new)
        if span.prefix_len:
            keys = _prefix_then_new(k_pool, self.prefix_slots[i], k[rows], q.dtype)
            values = _prefix_then_new(v_pool, self.prefix_slots[i], v[rows], q.dtype)
        else:
            keys, values = k[rows], v[rows]
        q_t = q[rows].transpose(0, 1).unsqueeze(0)  # (1, H, N, D), a strided view
        k_t = keys.transpose(0, 1).unsqueeze(0)  # (1, Hkv, P + N, D)
        v_t = values.transpose(0, 1).unsqueeze(0)
        for b in blocks:
            n_q = b.q_end - b.q_start
            q_b, k_b, v_b = (
                q_t[:, :, b.q_start : b.q_end],
                k_t[:, :, : b.kv_end],
                v_t[:, :, : b.kv_end],
            )
            stacked = gqa and n_q < self.stack_heads_below and b.mask is not MaskKind.CAUSAL
            mask = None
            if b.mask is MaskKind.TAIL:
                groups = q.shape[1] // k.shape[1] if stacked else 1
                widest = self._tail_mask(n_q, span.kv_len, q.dtype, q.device, groups)
                mask = widest[:, span.kv_len - b.kv_end :]  # zeros, then the block's triangle
            if stacked:
                o = F.scaled_dot_product_attention(
                    _stack_heads(q_b, k.shape[1]), k_b, v_b, attn_mask=mask, scale=scale
                ).reshape(1, q.shape[1], n_q, -1)  # (1, Hkv, G * block, Dv) -> (1, H, block, Dv)
            else:
                o = F.scaled_dot_product_attention(
                    q_b,
                    k_b,
                    v_b,
                    attn_mask=mask,
                    is_causal=b.mask is MaskKind.CAUSAL,
                    scale=scale,
                    enable_gqa=gqa,
                )  # (1, H, block, Dv)
            if out is None:
                return o[0].transpose(0, 1)  # (N, H, Dv): the kernel's own (N, H) layout
            out[span.q_start + b.q_start : span.q_start + b.q_end] = o[0].transpose(0, 1)
        return out

    def _tail_mask(self, n_queries, n_keys, dtype, device, groups: int = 1) -> torch.Tensor:
        """The tail mask, its rows repeated `groups` times for stacked heads. Kept for the
        batch's other layers; a request's query blocks share it, each taking a right-hand
        slice (at most two sizes per request: full blocks and the last one)."""
        key = (n_queries, n_keys, dtype, groups)
        mask = self._tail_masks.get(key)
        if mask is None:
            mask = tail_mask(n_queries, n_keys, dtype, device).repeat(groups, 1)
            self._tail_masks[key] = mask
        return mask

    # -- several small requests, one padded call -------------------------------------------
    def _run_group(self, group: _PaddedGroup, q, k, v, k_pool, v_pool, scale, gqa, out):
        g = group.group
        n_req = len(g.members)
        q_pad = q.new_zeros((n_req * g.n_max, q.shape[1], q.shape[2]))
        q_pad.index_copy_(0, group.q_dst, q.index_select(0, group.q_src))
        k_pad = _padded_kv(group, k, k_pool, n_req * g.kv_max, q.dtype)
        v_pad = _padded_kv(group, v, v_pool, n_req * g.kv_max, q.dtype)
        q_t = q_pad.view(n_req, g.n_max, *q.shape[1:]).transpose(1, 2)  # (R, H, n_max, D)
        k_t = k_pad.view(n_req, g.kv_max, *k.shape[1:]).transpose(1, 2)  # (R, Hkv, kv_max, D)
        v_t = v_pad.view(n_req, g.kv_max, *v.shape[1:]).transpose(1, 2)
        if gqa and g.n_max < self.stack_heads_below:
            groups = q.shape[1] // k.shape[1]
            o = F.scaled_dot_product_attention(
                _stack_heads(q_t, k.shape[1]),
                k_t,
                v_t,
                attn_mask=group.mask(q.dtype, q.device, groups),
                scale=scale,
            ).reshape(n_req, q.shape[1], g.n_max, -1)  # (R, Hkv, G * n_max, Dv) -> (R, H, ...)
        else:
            o = F.scaled_dot_product_attention(
                q_t, k_t, v_t, attn_mask=group.mask(q.dtype, q.device), scale=scale, enable_gqa=gqa
            )  # (R, H, n_max, Dv)
        o = o.transpose(1, 2).reshape(n_req * g.n_max, *out.shape[1:])
        out.index_copy_(0, group.q_src, o.index_select(0, group.q_dst))


def _prefix_keys(prefix_slots: list) -> list:
    """Per request, an identity of its cached prefix: requests whose prefixes are the same
    pool slots (the radix cache hands every hit on one prefix the same slots) get equal
    keys; None for requests without one."""
    keys: list = []
    seen: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
    for i, slots in enumerate(prefix_slots):
        if slots is None or slots.numel() == 0:
            keys.append(None)
            continue
        cheap = (slots.numel(), int(slots[0]), int(slots[-1]))
        candidates = seen.setdefault(cheap, [])
        for key, other in candidates:
            if other is slots or torch.equal(other, slots):
                keys.append(key)
                break
        else:
            candidates.append((i, slots))
            keys.append(i)
    return keys


class _SharedGroup:
    """Requests behind one cached prefix (plan.SharedPrefixGroup), run as: all members'
    queries against the prefix keys in one unmasked fused call (the prefix gathered from
    the pool once), each run of members against its own new keys in one causal call
    (shorter members zero-padded at the end: top-left causal hides the padding from real
    rows), and the two parts of each row's softmax merged by their log-sum-exps."""

    def __init__(self, group: SharedPrefixGroup, spans: list[Span], prefix_slots, device):
        self.group = group
        self.slots = prefix_slots[group.members[0]].to(device=device, dtype=torch.long)
        member_spans = [spans[i] for i in group.members]
        self._n_new = {i: s.n_new for i, s in zip(group.members, member_spans)}
        self._q_start = {i: s.q_start for i, s in zip(group.members, member_spans)}
        self.rows = torch.cat(
            [torch.arange(s.q_start, s.q_start + s.n_new, device=device) for s in member_spans]
        )
        first = member_spans[0].q_start
        self.contiguous = bool(
            torch.equal(self.rows, torch.arange(first, first + len(self.rows), device=device))
        )
        self.row_slice = slice(first, first + len(self.rows))
        local_start, start = {}, 0
        for i, s in zip(group.members, member_spans):
            local_start[i] = start
            start += s.n_new
        # per own run: (members, padded length, their rows in the padded call, the same
        # rows in the group's local order, whether both orders coincide: no copies)
        self.runs = []
        for run in group.own_runs:
            n_max = spans[run[0]].n_new
            pad_idx, local_idx = [], []
            for r, i in enumerate(run):
                n = spans[i].n_new
                pad_idx.append(torch.arange(n, device=device) + r * n_max)
                local_idx.append(torch.arange(n, device=device) + local_start[i])
            pad_idx, local_idx = torch.cat(pad_idx), torch.cat(local_idx)
            dense = len(pad_idx) == len(run) * n_max and bool(
                torch.equal(local_idx, torch.arange(local_idx[0], local_idx[0] + len(local_idx)))
            )
            self.runs.append((len(run), n_max, pad_idx, local_idx, dense))

    def run(self, q, k, v, k_pool, v_pool, scale, out) -> None:
        heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[2]
        g = heads // kv_heads
        if self.contiguous:
            q_g, k_g, v_g = q[self.row_slice], k[self.row_slice], v[self.row_slice]
        else:
            q_g, k_g, v_g = (x.index_select(0, self.rows) for x in (q, k, v))
        t = q_g.shape[0]
        # prefix part: (1, Hkv, G * T, D) queries (the G heads of a KV head stacked) vs P keys
        k_pre = k_pool.index_select(0, self.slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
        v_pre = v_pool.index_select(0, self.slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
        q_stacked = q_g.reshape(t, kv_heads, g, d).permute(1, 2, 0, 3).reshape(1, kv_heads, -1, d)
        o_pre, lse_pre = FLASH_WITH_LSE(q_stacked, k_pre, v_pre, scale=scale)
        o_pre = o_pre.view(kv_heads, g, t, -1).permute(2, 0, 1, 3).reshape(t, heads, -1)
        lse_pre = lse_pre.view(kv_heads, g, t).permute(2, 0, 1).reshape(t, heads)
        # own parts
        o_own = torch.empty_like(o_pre)
        lse_own = torch.empty_like(lse_pre)
        for n_run, n_max, pad_idx, local_idx, dense in self.runs:
            if dense:
                rows = slice(int(local_idx[0]), int(local_idx[0]) + n_run * n_max)
                q_r, k_r, v_r = q_g[rows], k_g[rows], v_g[rows]
            else:
                q_r, k_r, v_r = (
                    _padded(x, local_idx, pad_idx, n_run * n_max) for x in (q_g, k_g, v_g)
                )
            o_r, lse_r = FLASH_WITH_LSE(  # contiguous heads: ~1.4x faster at these sizes
                q_r.view(n_run, n_max, heads, d).transpose(1, 2).contiguous(),
                k_r.view(n_run, n_max, kv_heads, d).transpose(1, 2).contiguous(),
                v_r.view(n_run, n_max, kv_heads, -1).transpose(1, 2).contiguous(),
                is_causal=True,
                scale=scale,
            )  # (R, H, n_max, Dv), (R, H, n_max)
            o_r = o_r.transpose(1, 2).reshape(n_run * n_max, heads, -1)
            lse_r = lse_r.transpose(1, 2).reshape(n_run * n_max, heads)
            if dense:
                o_own[rows], lse_own[rows] = o_r, lse_r
            else:
                o_own.index_copy_(0, local_idx, o_r.index_select(0, pad_idx))
                lse_own.index_copy_(0, local_idx, lse_r.index_select(0, pad_idx))
        lse = torch.logaddexp(lse_pre, lse_own)
        merged = o_pre.float().mul_(torch.exp(lse_pre - lse).unsqueeze(-1))
        merged.add_(o_own.float().mul_(torch.exp(lse_own - lse).unsqueeze(-1)))
        if self.contiguous:
            out[self.row_slice] = merged
        else:
            out.index_copy_(0, self.rows, merged.to(out.dtype))

    def run_windowed(self, q, k, v, k_pool, v_pool, scale, out, window, sinks) -> None:
        """run() with a sliding window and / or sinks (windowed.py): every member's queries
        against the shared prefix in one masked call (the prefix gathered once; a member's
        j-th new token is at position P + j, so one mask serves all members), each
        member's own part causal (and windowed), merged by log-sum-exp, then the sinks."""
        p = self.group.prefix_len
        device = q.device
        local = torch.cat([torch.arange(self._n_new[i], device=device) for i in self.group.members])
        q_g = q.index_select(0, self.rows)
        lo = windowed.first_key(p, window)
        slots = self.slots[lo:]
        prefix = windowed.attend(
            q_g,
            k_pool.index_select(0, slots),
            v_pool.index_select(0, slots),
            windowed.visible(p + local, torch.arange(lo, p, device=device), window),
            scale,
        )
        o_own = torch.empty(prefix[0].shape, dtype=torch.float32, device=device)
        lse_own = torch.empty(prefix[1].shape, dtype=torch.float32, device=device)
        start = 0
        for i in self.group.members:
            n = self._n_new[i]
            rows = slice(self._q_start[i], self._q_start[i] + n)
            pos = torch.arange(n, device=device)
            o_i, lse_i = windowed.attend(
                q[rows], k[rows], v[rows], windowed.visible(pos, pos, window), scale
            )
            o_own[start : start + n], lse_own[start : start + n] = o_i, lse_i
            start += n
        o, lse = windowed.merge([prefix, (o_own, lse_own)])
        out.index_copy_(0, self.rows, windowed.with_sinks(o, lse, sinks).to(out.dtype))


def _padded(x, local_idx, pad_idx, n_rows) -> torch.Tensor:
    buf = x.new_zeros((n_rows, *x.shape[1:]))
    buf.index_copy_(0, pad_idx, x.index_select(0, local_idx))
    return buf


def _stack_heads(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, H, N, D) -> (B, Hkv, G * N, D): the G query heads that share a KV head (SDPA's
    enable_gqa grouping: heads j*G .. j*G + G-1 use KV head j) one after another."""
    batch, heads, n, d = q.shape
    return q.reshape(batch, kv_heads, (heads // kv_heads) * n, d)


def _prefix_then_new(pool, slots, new, dtype) -> torch.Tensor:
    """(P + N, Hkv, D): the prefix gathered from the pool, then the new rows."""
    n_prefix = slots.shape[0]
    buf = torch.empty((n_prefix + new.shape[0], *new.shape[1:]), dtype=dtype, device=new.device)
    if pool.dtype == dtype:
        torch.index_select(pool, 0, slots, out=buf[:n_prefix])
    else:
        buf[:n_prefix] = pool.index_select(0, slots)
    buf[n_prefix:] = new
    return buf


def _padded_kv(group: _PaddedGroup, new, pool, n_rows, dtype) -> torch.Tensor:
    """(R * kv_max, Hkv, D): each request's prefix and new rows; padding rows are zero."""
    buf = torch.zeros((n_rows, *new.shape[1:]), dtype=dtype, device=new.device)
    if group.prefix_src is not None:
        buf.index_copy_(0, group.prefix_dst, pool.index_select(0, group.prefix_src).to(dtype))
    buf.index_copy_(0, group.new_dst, new.index_select(0, group.new_src).to(dtype))
    return buf
