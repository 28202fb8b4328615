"""How one extend batch's attention is cut into SDPA calls (plain Python, no torch).

Each request of an extend batch has `prefix_len` tokens whose KV is already in the pool
(a prefix-cache hit, or an earlier chunk) and `n_new` new tokens. Only the new tokens'
queries are computed; each attends to all prefix keys and causally to the new keys:

        keys ->   prefix (P)        new (N)
    new q 0    [ 1 1 1 ... 1 |  1 0 0 ... 0 ]
    new q 1    [ 1 1 1 ... 1 |  1 1 0 ... 0 ]      a bottom-right-aligned causal mask
    ...
    new q N-1  [ 1 1 1 ... 1 |  1 1 1 ... 1 ]

PyTorch's fused SDPA only knows top-left causal (`is_causal`), which is the right mask
when P == 0 (cold request). Otherwise the mask is given explicitly, and to keep it small
for long requests the queries are split into blocks: block [s, e) reads keys
[0, P + e) and needs a mask only over its own last e - s keys.

Requests behind the same cached prefix (one user's items, scored together) share it:
their attention is split in two exact parts merged by log-sum-exp: every member's queries
against the prefix keys, gathered once, in ONE unmasked call (the kernel's best case: G x
sum(n_new) query rows per KV head, no mask), and each member's queries against its own new
keys (causal, members of similar length padded into one call: top-left causal keeps the
padding out of real rows). Without this, k items behind one prefix gathered it k times and
ran k masked calls: a batch cost more than the same items one by one.

Other small requests are batched too: the fused kernel's fixed cost per call (~2-10 ms on
the 2-core dev machine, measured) dominates a 100-token item, so requests of similar size
are padded to one shape and run as one call with a per-request mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class MaskKind(Enum):
    CAUSAL = "causal"  # SDPA is_causal=True: square block starting at key 0 (cold request)
    NONE = "none"  # every query sees every key (a single new token)
    TAIL = "tail"  # explicit mask: all keys but the block's own last ones are visible


@dataclass(frozen=True)
class Span:
    """One request's part of an extend batch."""

    q_start: int  # row of its first new token in the batch's q / k / v
    prefix_len: int  # tokens already in the KV pool, before the new ones
    n_new: int

    @property
    def kv_len(self) -> int:
        return self.prefix_len + self.n_new

    @property
    def work(self) -> int:
        """Query x key pairs it needs (the mask's area)."""
        return self.n_new * self.kv_len


@dataclass(frozen=True)
class QueryBlock:
    """New queries [q_start, q_end) of one request against its keys [0, kv_end)."""

    q_start: int
    q_end: int
    kv_end: int
    mask: MaskKind


@dataclass(frozen=True)
class Limits:
    """Tuning knobs (defaults measured on the 2-core dev machine, bf16 and fp32)."""

    max_block_mask: int = 1 << 25  # elements of one query block's mask (64 MB in bf16)
    min_block: int = 256  # smaller query blocks run the fused kernel badly
    small_work: int = 1 << 21  # requests up to this many q x k pairs may be batched
    max_group_mask: int = 1 << 22  # elements of one padded batch's mask
    max_padding: float = 0.5  # padded area may exceed the useful area by this share...
    padding_slack: int = 1 << 16  # ...or by this many pairs (tiny requests)
    # Masked calls with fewer queries than this: the query heads that share a KV head are
    # stacked along the query axis (G x N queries per KV head, the mask repeated G times)
    # instead of SDPA's enable_gqa. Exact either way; the CPU kernel tiles queries by 32 /
    # 64 / 256 rows for < 192 / < 768 / more queries, so short items get bigger tiles
    # (measured: a 100-token item behind 1k-16k cached tokens, 0.66-0.98x the time).
    stack_heads_below: int = 768


DEFAULT_LIMITS = Limits()


def plan_query_blocks(
    prefix_len: int, n_new: int, limits: Limits = DEFAULT_LIMITS
) -> list[QueryBlock]:
    """Blocks for one request computed on its own (not batched)."""
    if n_new <= 0:
        return []
    kv_len = prefix_len + n_new
    if prefix_len == 0:
        return [QueryBlock(0, n_new, n_new, MaskKind.CAUSAL)]
    if n_new == 1:
        return [QueryBlock(0, 1, kv_len, MaskKind.NONE)]
    block = max(limits.min_block, limits.max_block_mask // kv_len)
    blocks = []
    for start in range(0, n_new, block):
        end = min(n_new, start + block)
        blocks.append(QueryBlock(start, end, prefix_len + end, MaskKind.TAIL))
    return blocks


@dataclass(frozen=True)
class SharedPrefixGroup:
    """Requests (indices into the batch's spans) behind one identical cached prefix: the
    prefix part is one call; the own parts run in `own_runs` (members of similar new
    length, each run one padded causal call)."""

    members: tuple[int, ...]
    prefix_len: int
    own_runs: tuple[tuple[int, ...], ...]


def plan_shared_prefix(
    spans: list[Span], prefix_keys: list, limits: Limits = DEFAULT_LIMITS
) -> tuple[list[int], list[SharedPrefixGroup]]:
    """Splits off the requests that share a cached prefix with another one.

    prefix_keys: per request, a hashable identity of its cached prefix (equal keys: the
    same pool slots), or None. Returns (the other requests' indices, the groups). A run of
    own parts pads members to the longest new length while that at most doubles the run's
    own-part area (or adds at most `padding_slack` pairs).
    """
    by_key: dict = {}
    for i, (span, key) in enumerate(zip(spans, prefix_keys)):
        if key is not None and span.prefix_len > 0 and span.n_new > 0:
            by_key.setdefault(key, []).append(i)
    grouped: set[int] = set()
    groups = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        grouped.update(members)
        groups.append(
            SharedPrefixGroup(
                members=tuple(members),
                prefix_len=spans[members[0]].prefix_len,
                own_runs=_own_runs(spans, members, limits),
            )
        )
    rest = [i for i in range(len(spans)) if i not in grouped]
    return rest, groups


def _own_runs(spans: list[Span], members: list[int], limits: Limits) -> tuple:
    """Members sorted by new length, cut where padding to the run's longest would more
    than double the causal area n^2 / 2 of the run."""
    order = sorted(members, key=lambda i: spans[i].n_new, reverse=True)
    runs, current = [], []
    for i in order:
        candidate = current + [i]
        n_max = spans[candidate[0]].n_new
        padded = len(candidate) * n_max * n_max
        useful = sum(spans[j].n_new ** 2 for j in candidate)
        if current and padded > 2 * useful and padded > useful + limits.padding_slack:
            runs.append(tuple(current))
            candidate = [i]
        current = candidate
    runs.append(tuple(current))
    return tuple(runs)


@dataclass(frozen=True)
class Group:
    """Requests (indices into the batch's spans) run as one padded SDPA call."""

    members: tuple[int, ...]
    n_max: int  # padded query length
    kv_max: int  # padded key length

    @property
    def area(self) -> int:
        return len(self.members) * self.n_max * self.kv_max


def plan_groups(
    spans: list[Span], limits: Limits = DEFAULT_LIMITS
) -> tuple[list[int], list[Group]]:
    """Split a batch into requests run alone (list of indices) and padded groups.

    Small requests are sorted by key length and packed greedily while the padded area
    stays within `max_padding` of the useful one (or `padding_slack` pairs) and the
    mask within `max_group_mask` elements. A group of one is run alone.
    """
    alone = [i for i, s in enumerate(spans) if s.n_new > 0 and s.work > limits.small_work]
    small = [i for i, s in enumerate(spans) if s.n_new > 0 and s.work <= limits.small_work]
    small.sort(key=lambda i: (spans[i].kv_len, spans[i].n_new), reverse=True)

    groups: list[Group] = []
    current: list[int] = []
    for i in small:
        candidate = current + [i]
        n_max = max(spans[j].n_new for j in candidate)
        kv_max = max(spans[j].kv_len for j in candidate)
        area = len(candidate) * n_max * kv_max
        useful = sum(spans[j].work for j in candidate)
        fits = area <= limits.max_group_mask and (
            area <= useful * (1 + limits.max_padding) or area <= useful + limits.padding_slack
        )
        if current and not fits:
            groups.append(_group(spans, current))
            candidate = [i]
        current = candidate
    if current:
        groups.append(_group(spans, current))

    alone += [g.members[0] for g in groups if len(g.members) == 1]
    return sorted(alone), [g for g in groups if len(g.members) > 1]


def _group(spans: list[Span], members: list[int]) -> Group:
    return Group(
        members=tuple(members),
        n_max=max(spans[j].n_new for j in members),
        kv_max=max(spans[j].kv_len for j in members),
    )


@dataclass(frozen=True)
class QueryChunkPlan:
    """The batch's query rows [start, end) (one chunk of a layer run in query chunks,
    features/hybrid_prefill/layer_chunks.py), split by request.

    head: the request whose new tokens began before the chunk (None: the chunk starts at
        a request's first new token). Its queries are the chunk's first `head_rows` rows;
        it also sees its cached prefix and its own `head_before` earlier new tokens: the
        first `head_kept` of them in the pool (the rows whose KV it keeps), the rest in
        the layer's own keys (prefill_attention/layer_keys.py: rows prefill-only KV drops).
    rest: the requests whose first new token is in the chunk, as spans in chunk-local rows
        (n_new cut at the chunk's end): to them the chunk is an ordinary extend batch.
    """

    start: int
    end: int
    head: int | None
    head_before: int
    head_rows: int
    rest: tuple[tuple[int, Span], ...]
    head_kept: int = 0

    @property
    def head_dropped(self) -> int:
        """The head's earlier new tokens whose KV the pool does not hold."""
        return self.head_before - self.head_kept


def plan_query_chunk(
    spans: list[Span], start: int, end: int, kept: list[int] | None = None
) -> QueryChunkPlan:
    """Which request's queries are where in the batch's rows [start, end). kept: per
    request, how many of its new tokens (the first ones) own a pool slot, whose k / v
    later chunks read from the pool (the backends: prefill_kv's record, every token
    where it is off); None: none does, the caller hands the head its earlier keys (the
    GPU kit's harness, which keeps its layer's whole K / V)."""
    if not 0 <= start < end:
        raise ValueError(f"query chunk [{start}, {end}) is empty or negative")
    head, head_before, head_rows, rest = None, 0, 0, []
    for i, span in enumerate(spans):
        first, last = span.q_start, span.q_start + span.n_new
        if span.n_new == 0 or last <= start or first >= end:
            continue
        if first < start:
            head, head_before, head_rows = i, start - first, min(last, end) - start
        else:
            local = Span(first - start, span.prefix_len, min(last, end) - first)
            rest.append((i, local))
    head_kept = 0
    if head is not None and kept is not None:
        head_kept = min(kept[head], head_before)
    return QueryChunkPlan(start, end, head, head_before, head_rows, tuple(rest), head_kept)


def kept_keys(spans: list[Span], kept: list[int] | None, start: int, end: int):
    """The rows of the chunk [start, end) that later chunks read and the pool does not
    hold: the dropped rows (past its first kept[i]) of the one request that continues past
    `end`, as (request, first row, end row, its first position in that request's own
    keys), or None."""
    if kept is None:
        return None
    for i, span in enumerate(spans):
        first, last = span.q_start, span.q_start + span.n_new
        if first < end < last:
            lo = max(start, first + kept[i])
            if lo >= end:
                return None
            return i, lo, end, lo - first - kept[i]
    return None


def from_whole_kv(plan: QueryChunkPlan, head_first_row: int | None, k_all, v_all):
    """(k, v, earlier) of a chunk from a layer's whole K / V (rows before the chunk's end
    computed), for a caller that keeps them whole (the GPU kit's harness:
    layer_chunks.run_layer_in_chunks, benchmarks/gpu_prefill.py): the chunk's rows, and
    the head's earlier rows past those the plan reads from the pool."""
    start, end = plan.start, plan.end
    earlier = None
    if plan.head is not None and plan.head_dropped:
        lo = head_first_row + plan.head_kept
        earlier = (k_all[lo:start], v_all[lo:start])
    return k_all[start:end], v_all[start:end], earlier
