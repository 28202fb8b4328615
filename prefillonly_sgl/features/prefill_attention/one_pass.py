"""A packed extend batch's attention as ONE paged pass per layer (plain Python, no torch).

Today an extend batch runs three kernels per layer on CUDA (SGLang's FlashInfer extend):
a ragged causal pass over the new tokens' own keys, a paged pass over each request's
cached (or borrowed) prefix, and a log-sum-exp merge of the two. Each follower packed
behind its leader (prefill_kv/packing.py) is its own request there: it reads the shared
prefix on its own and pads its own ~180 queries to the kernel's query tiles.

Here each prefix group becomes one sequence of FlashInfer's paged prefill under the mask
multi-item scoring uses (MaskMode.MULTIITEMSCORING: `prefix_len_ptr`,
`token_pos_in_items_ptr`, `max_item_len_ptr`), with every key read from the pool:

    sequence    [ head's row [0, S) | head's item | follower 1's item | follower 2's ... ]
    kv          head's slots [0, S), then each member's new rows (their write slots)
    queries     the head's new rows (from its cached P on), then every follower's rows
    mask        a key before S: causal (the prefix part, and what every item sees);
                a key after S: only the query's own item, causal (positions 1..len)

FlashInfer's kernel (include/flashinfer/attention/prefill.cuh,
logits_mask_multi_item_scoring) lets query i at sequence position p >= prefix_len see
key j iff j <= p and (j < prefix_len or p < j + token_pos[p - prefix_len]); with each
item's tokens numbered 1..len and no delimiter between items, that is "the prefix, and
your own item's tokens up to you". It also skips the key tiles between the prefix and
(first query of the tile - max_item_len): items never scan each other. Queries are the
sequence's last positions (bottom-right), so the head's cached P (its keys, no queries)
may sit before them, and its new rows [P, S) are prefix queries (causal).

A request without followers is a sequence of its own with prefix_len = its kv length
(everything causal: the same kernel, its plain causal path).

Who is a group: consecutive requests of the batch where each member reads [0, S) from a
request before it in the group (the JCT scheduler admits a group whole and in order, and
prefill_kv packs a member behind the one admitted just before it), all with the same S
(their prefix_len), the head keeping at least [0, S). Anything else starts a sequence of
its own, which is always correct.

uint16 limits (FlashInfer's token_pos_in_items / max_item_len): an item longer than
MAX_ITEM_TOKENS makes its group fall back to sequences of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_ITEM_TOKENS = 65535  # FlashInfer stores item positions as uint16


@dataclass(frozen=True)
class Member:
    """One request of an extend batch, in batch order."""

    prefix_len: int  # tokens before its new rows (cached, or read from its leader)
    new_len: int
    leader: int | None = None  # batch index of the request whose [0, prefix_len) it reads


@dataclass(frozen=True)
class KvSegment:
    """Keys of a sequence taken from one request: its row's positions [start, end) that
    are cached (read from the request table), then its new rows (their write slots)."""

    request: int
    cached: tuple[int, int]  # (start, end) of its row read from the request table
    new_rows: tuple[int, int]  # (first, last + 1) of its rows in the batch


@dataclass(frozen=True)
class Sequence_:
    """One sequence of the paged pass: a prefix group, or one request alone."""

    members: tuple[int, ...]
    prefix_len: int  # MIS prefix: keys [0, prefix_len) are causal for every query
    kv_len: int
    qo_len: int
    item_lens: tuple[int, ...]  # the keys after prefix_len, item by item (may hold 0s)

    @property
    def grouped(self) -> bool:
        return len(self.members) > 1


@dataclass(frozen=True)
class OnePassPlan:
    sequences: tuple[Sequence_, ...]
    segments: tuple[KvSegment, ...]  # kv order: sequence by sequence

    @property
    def qo_indptr(self) -> list[int]:
        return _indptr(s.qo_len for s in self.sequences)

    @property
    def kv_indptr(self) -> list[int]:
        return _indptr(s.kv_len for s in self.sequences)

    @property
    def grouped(self) -> bool:
        """Whether any sequence holds a group (else plain causal sequences: no item mask)."""
        return any(s.grouped for s in self.sequences)

    def prefix_lens(self) -> list[int]:
        return [s.prefix_len for s in self.sequences]

    def token_pos_len(self) -> int:
        """The padded stride of token_pos_in_items per sequence (at least 1)."""
        return max([1] + [sum(s.item_lens) for s in self.sequences])

    def token_pos(self) -> np.ndarray:
        """FlashInfer's token_pos_in_items: per sequence, each key after its prefix numbered
        by its place in its item (1..len), zero-padded to token_pos_len()."""
        stride = self.token_pos_len()
        out = np.zeros(stride * len(self.sequences), dtype=np.int64)
        for i, s in enumerate(self.sequences):
            at = i * stride
            for n in s.item_lens:
                out[at : at + n] = np.arange(1, n + 1)
                at += n
        return out

    def max_item_lens(self) -> list[int]:
        return [max(s.item_lens, default=0) for s in self.sequences]

    def kv_positions(self) -> tuple[list[tuple[int, int, int, int]], np.ndarray]:
        """Where each entry of the flat kv index list comes from: the runs read from the
        request table, as (kv offset, request, row start, row end), and the kv offset of
        every new row of the batch, in batch row order (segments follow batch order)."""
        cached, new = [], []
        offset = 0
        for seg in self.segments:
            lo, hi = seg.cached
            if hi > lo:
                cached.append((offset, seg.request, lo, hi))
                offset += hi - lo
            first, last = seg.new_rows
            new.append(np.arange(offset, offset + last - first))
            offset += last - first
        return cached, np.concatenate(new) if new else np.zeros(0, dtype=np.int64)


def _indptr(lengths) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def group_members(members: Sequence[Member]) -> list[list[int]]:
    """The batch's requests cut into sequences (module docstring: who is a group)."""
    runs: list[list[int]] = []
    for i, m in enumerate(members):
        run = runs[-1] if runs else None
        if (
            run is not None
            and m.leader is not None
            and m.leader in run
            and m.leader < i
            and run[-1] == i - 1
            and m.prefix_len > 0
            and _shares(members, run, m.prefix_len)
        ):
            run.append(i)
        else:
            runs.append([i])
    return runs


def _shares(members: Sequence[Member], run: list[int], s: int) -> bool:
    """Whether `run` (a head and its followers so far) is a group behind the same S: the
    head keeps [0, S) (its row reaches S), every follower's prefix is S."""
    head = members[run[0]]
    if head.prefix_len + head.new_len < s:
        return False
    return all(members[j].prefix_len == s for j in run[1:])


def plan(members: Sequence[Member]) -> OnePassPlan:
    """The sequences and key segments of one forward's paged pass."""
    rows = _indptr(m.new_len for m in members)
    sequences, segments = [], []
    for run in group_members(members):
        if len(run) > 1 and not _fits_uint16(members, run):
            for i in run:
                seq, segs = _alone(members, rows, i)
                sequences.append(seq)
                segments.extend(segs)
            continue
        if len(run) == 1:
            seq, segs = _alone(members, rows, run[0])
        else:
            seq, segs = _group(members, rows, run)
        sequences.append(seq)
        segments.extend(segs)
    return OnePassPlan(tuple(sequences), tuple(segments))


def _alone(members, rows, i) -> tuple[Sequence_, list[KvSegment]]:
    m = members[i]
    kv = m.prefix_len + m.new_len
    seq = Sequence_((i,), prefix_len=kv, kv_len=kv, qo_len=m.new_len, item_lens=())
    return seq, [KvSegment(i, (0, m.prefix_len), (rows[i], rows[i + 1]))]


def _group(members, rows, run) -> tuple[Sequence_, list[KvSegment]]:
    head, s = run[0], members[run[1]].prefix_len
    h = members[head]
    # The head: its cached part, then its new rows (prefix queries up to S, then its
    # item). Its item counts from S: where its cached part reaches past S, those keys
    # are its item's first tokens (keys without queries, before the first query).
    segs = [KvSegment(head, (0, h.prefix_len), (rows[head], rows[head + 1]))]
    items = [h.prefix_len + h.new_len - s]
    for j in run[1:]:
        segs.append(KvSegment(j, (0, 0), (rows[j], rows[j + 1])))
        items.append(members[j].new_len)
    qo = sum(members[j].new_len for j in run)
    seq = Sequence_(
        tuple(run), prefix_len=s, kv_len=s + sum(items), qo_len=qo, item_lens=tuple(items)
    )
    return seq, segs


def _fits_uint16(members, run) -> bool:
    s = members[run[1]].prefix_len
    h = members[run[0]]
    longest = max([h.prefix_len + h.new_len - s] + [members[j].new_len for j in run[1:]])
    return longest <= MAX_ITEM_TOKENS
