"""Attention of one query chunk of an extend batch (CPU path, plain torch, no SGLang).

A decoder layer run in query chunks (features/hybrid_prefill/layer_chunks.py) computes the
attention of the batch's rows [start, end) from the chunk's own k / v, the pool and the
keys the layer keeps for later chunks (layer_keys.py). plan.plan_query_chunk says which
request is where:

- the requests whose new tokens begin in the chunk are an ordinary extend batch of the
  chunk's rows (their own keys all lie in it): ExtendAttention, with its batching and
  shared-prefix groups;
- the one request that began before the chunk (the "head": a long prompt's later chunks)
  attends to three sets of keys: the pool's (its cached prefix, then its own earlier new
  tokens that own a slot: written there by their chunks), its own earlier new tokens
  without a slot (the layer's kept keys: rows prefill-only KV drops), and the chunk's own
  tokens (causal). Each part is fused calls returning their log-sum-exps, merged exactly
  one call at a time; no mask and no copy of the earlier keys beyond POOL_BLOCK of them at
  a time (a mask over 30k keys, or keys gathered into one tensor, would be as large as
  what the chunking saves): the pool's keys are read in place where their slots run
  consecutively, and gathered POOL_BLOCK at a time where they do not.

    chunk = QueryChunkAttention(plan, spans, prefix_slots, own_slots)      # once per forward
    out = chunk(q, k, v, k_pool, v_pool, scale, earlier=kept keys)         # once per layer

A caller that keeps its layer's whole K / V (the GPU kit's harness) hands them instead of
the chunk's k / v, planned without kept counts (plan.from_whole_kv).
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
    from_whole_kv,
)

# The pool's keys one call reads: a view of this many consecutive slots, or a gather of
# at most this many (+ a run shorter than MIN_VIEW) where the slots do not run on.
POOL_BLOCK = 4096
MIN_VIEW = 64


def query_chunks_supported() -> bool:
    """The head's three parts need the fused kernel's log-sum-exp (torch >= 2.2)."""
    return FLASH_WITH_LSE is not None


def pool_reads(slots: torch.Tensor, block: int | None = None) -> list[tuple]:
    """How to read the pool's keys at `slots` (a CPU integer tensor) without copying more
    than `block` (POOL_BLOCK) of them at once, in order: ("run", first slot, count) for
    consecutive slots (a view of the pool), ("gather", a, b) for slots[a:b] gathered.
    Only integers: a plan kept for a whole forward holds no copy of the slots."""
    block = block or POOL_BLOCK
    n = int(slots.numel())
    if n == 0:
        return []
    breaks = ((slots[1:] - slots[:-1]) != 1).nonzero().flatten().add_(1).tolist()
    bounds = [0, *breaks, n]
    reads: list[tuple] = []
    pending = None  # [a, b): short runs, gathered together

    for a, b in zip(bounds[:-1], bounds[1:]):
        if b - a >= min(MIN_VIEW, block):
            if pending is not None:
                reads.append(("gather", *pending))
                pending = None
            for s in range(a, b, block):
                reads.append(("run", int(slots[s]), min(block, b - s)))
            continue
        pending = (a, b) if pending is None else (pending[0], b)
        if pending[1] - pending[0] >= block:
            reads.append(("gather", *pending))
            pending = None
    if pending is not None:
        reads.append(("gather", *pending))
    return reads


def read_pool(k_pool, v_pool, slots, read, dtype):
    """The (k, v) of one pool_reads entry over `slots`: a view, or a gathered copy."""
    kind, a, b = read
    if kind == "run":
        k, v = k_pool[a : a + b], v_pool[a : a + b]
    else:
        k, v = k_pool.index_select(0, slots[a:b]), v_pool.index_select(0, slots[a:b])
    return k.to(dtype), v.to(dtype)


def _count(read) -> int:
    kind, a, b = read
    return b if kind == "run" else b - a


class QueryChunkAttention:
    def __init__(
        self,
        plan: QueryChunkPlan,
        spans: list[Span],
        prefix_slots: list,
        own_slots=None,  # the head's earlier new tokens' pool slots (its plan.head_kept)
        device="cpu",
        limits: Limits = DEFAULT_LIMITS,
        shared_prefix: bool = True,
    ) -> None:
        if not query_chunks_supported():
            raise RuntimeError("query-chunked attention needs torch's fused CPU attention")
        self.plan = plan
        # the head's keys in the pool, in position order: its prefix's slots, then its own
        # earlier new tokens' (views of the forward's tensors: no copy per chunk), each
        # read as pool_reads says: (position of the first key, slots, read)
        self.reads: list[tuple[int, torch.Tensor, tuple]] = []
        self.pooled = 0  # how many
        self.prefix_len = 0
        self.head_first_row = None
        if plan.head is not None:
            head = spans[plan.head]
            self.prefix_len = head.prefix_len
            self.head_first_row = head.q_start
            parts = []
            slots = prefix_slots[plan.head]
            if head.prefix_len and slots is not None:
                parts.append(slots)
            if plan.head_kept:
                if own_slots is None or int(own_slots.numel()) != plan.head_kept:
                    raise ValueError(
                        f"the head's {plan.head_kept} earlier new tokens in the pool need "
                        "their slots (own_slots)"
                    )
                parts.append(own_slots)
            for part in parts:
                part = part.to(device)
                position = self.pooled
                for read in pool_reads(part):
                    self.reads.append((position, part, read))
                    position += _count(read)
                self.pooled += int(part.numel())
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
        k: torch.Tensor,  # (end - start, Hkv, D): the chunk's own keys
        v: torch.Tensor,  # (end - start, Hkv, Dv)
        k_pool: torch.Tensor,  # (slots, Hkv, D)
        v_pool: torch.Tensor,
        scale: float | None,
        window: int | None = None,  # a sliding layer's window (windowed.py); None: full
        sinks: torch.Tensor | None = None,  # (H,) attention-sink logits (gpt-oss)
        earlier=None,  # (k, v) of the head's earlier new tokens without a pool slot
    ) -> torch.Tensor:
        # k / v with more rows than q: the layer's whole K / V (from_whole_kv)
        """(end - start, H, Dv) attention output of the chunk's rows."""
        if k.shape[0] != q.shape[0]:
            k, v, earlier = from_whole_kv(self.plan, self.head_first_row, k, v)
        extra = {"window": window, "sinks": sinks}
        if self.plan.head is None:
            return self.rest(q, k, v, k_pool, v_pool, scale, **extra)
        dropped = self.plan.head_dropped
        if dropped and (earlier is None or earlier[0].shape[0] != dropped):
            raise ValueError(f"the head's {dropped} earlier keys without a pool slot are needed")
        out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
        rows = self.plan.head_rows
        own = (k[:rows], v[:rows])
        if window is None and sinks is None:
            self._head(q[:rows], own, earlier, k_pool, v_pool, scale, out[:rows])
        else:
            self._head_windowed(q[:rows], own, earlier, k_pool, v_pool, scale, out[:rows], **extra)
        if self.rest is not None:
            self.rest(q, k, v, k_pool, v_pool, scale, out=out, **extra)
        return out

    def _head_windowed(self, q, own, earlier, k_pool, v_pool, scale, out, window, sinks):
        """_head with a window and / or sinks: the same parts, masked by position (the
        pool's keys are positions [0, p + kept), the kept keys the next ones, the head's
        j-th row in the chunk is at position P + before + j) and cut to the keys the
        window reaches, merged, then the sinks."""
        n, before, pooled = q.shape[0], self.plan.head_before, self.pooled
        first_q = self.prefix_len + before
        q_pos = torch.arange(first_q, first_q + n, device=q.device)
        lo = windowed.first_key(first_q, window)  # earliest key position any row sees
        merged = _Merged()
        for position, slots, read in self.reads:
            count = _count(read)
            if position + count <= lo:
                continue
            k_pos = torch.arange(position, position + count, device=q.device)
            k_pre, v_pre = read_pool(k_pool, v_pool, slots, read, q.dtype)
            merged.add(
                *windowed.attend(q, k_pre, v_pre, windowed.visible(q_pos, k_pos, window), scale)
            )
        if earlier is not None and earlier[0].shape[0] and pooled + earlier[0].shape[0] > lo:
            cut = max(0, lo - pooled)  # from the first one the window reaches
            k_pos = torch.arange(pooled + cut, pooled + earlier[0].shape[0], device=q.device)
            seen = windowed.visible(q_pos, k_pos, window)
            merged.add(*windowed.attend(q, earlier[0][cut:], earlier[1][cut:], seen, scale))
        merged.add(
            *windowed.attend(q, own[0], own[1], windowed.visible(q_pos, q_pos, window), scale)
        )
        out.copy_(windowed.with_sinks(merged.o, merged.lse, sinks))

    def _head(self, q, own, earlier, k_pool, v_pool, scale, out) -> None:
        """The head request's rows: the pool's keys + its earlier kept keys + its own
        chunk rows (causal)."""
        merged = _Merged()
        for _, slots, read in self.reads:
            k_pre, v_pre = read_pool(k_pool, v_pool, slots, read, q.dtype)
            merged.add(*_unmasked(q, k_pre, v_pre, scale))
        if earlier is not None and earlier[0].shape[0]:
            merged.add(*_unmasked(q, earlier[0].to(q.dtype), earlier[1].to(q.dtype), scale))
        merged.add(*_causal(q, own[0], own[1], scale))
        out.copy_(merged.o)


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


class _Merged:
    """The softmax over the union of several parts' keys, from each part's normalised
    output and log-sum-exp, folded in one part at a time (a running output and log-sum-exp
    in float32: one part's output alive beside it, however many parts): sum_i o_i *
    exp(lse_i - lse). A row a part's keys all hide from (lse -inf) takes nothing from it."""

    def __init__(self) -> None:
        self.o = self.lse = None

    def add(self, o: torch.Tensor, lse: torch.Tensor) -> None:
        o = o.float()
        if self.o is None:
            self.o, self.lse = o, lse.float()
            return
        lse_new = torch.logaddexp(self.lse, lse)
        keep = torch.exp(self.lse - lse_new).nan_to_num_(0.0).unsqueeze(-1)
        take = torch.exp(lse - lse_new).nan_to_num_(0.0).unsqueeze(-1)
        self.o.mul_(keep).add_(o.mul_(take))
        self.lse = lse_new
