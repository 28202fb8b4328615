"""Followers packed behind their leader: one extend for a prefix group (plain Python).

A cold prefix group (one user's profile against its items, one query and its items) used
to take two forwards: its leader computed the shared prefix, and the other members ran a
round later as cache hits. On a GPU a small model's forward costs mostly its fixed
overhead (kernel launches, the scheduler's Python), not its tokens, so that second round
doubled what such a request cost (issue 62: SGLang's own items shape, 0 vs 281 items/s).

Instead, a request admitted into an extend batch behind another request of the same batch
that computes *and keeps* the KV of their common prefix (its leader) reads that prefix
from the leader's pool slots: its extend starts where the common part ends, as if that
part were cached. The forward writes every kept token's k / v into the pool layer by
layer before any request of the batch reads the pool (the prefill-only attention
backends, CPU and FlashInfer, write first), so the follower's attention sees the
leader's keys of the same layer. Items stay masked from each other: each is its own
sequence, attending to the prefix and to itself.

    leader     [ cached P | computed this forward, kept      | computed, dropped ]
    follower   [ cached P | the leader's slots (this forward) | own new tokens    ]
               0          P                                   S                   n

S is the common token prefix of the two prompts, within what the leader keeps and what
the follower may take as a prefix at all (SGLang's own cap: its last token, and
prompt-logprob positions, are always computed). Its KV is the same KV: a causal model's
K / V at a position depend only on the tokens up to it.

Who owns the borrowed slots: the leader, as ever (it inserts them into the radix cache
when it finishes, or frees them). The follower treats [0, S) as protected (never its to
free) and, when it finishes, inserts only its own tokens after S; should the cache not
hold [0, S) by then (the leader was aborted), it inserts nothing (scheduler_process.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from prefillonly_sgl.features.prefill_kv.policy import kept_new_tokens

# The fewest tokens worth reading from a leader. Unrelated prompts often share a first
# token or two (a BOS, a chat template's opening), and a request behind any cached or
# borrowed prefix is attended as a hit (a masked call on CPU, where a cold one is a plain
# causal one): a few shared tokens would cost more than they save.
MIN_PACKED_TOKENS = 16


# On a follower from its admission to its release (scheduler_process.py): what it reads
# from whom. The forward log counts the requests that carry it.
FOLLOWER_MARK = "_prefillonly_follows"


def kept_end(prefix_len: int, extend_end: int, total_len: int, reusable_len: int | None) -> int:
    """Where the real pool slots of a request's row end once this extend is allocated:
    tokens [0, kept_end) hold KV (cached or written by this forward). A request without R
    keeps every token; a score prompt keeps its prefix up to max(R, prefix, 1) on its
    last chunk, everything on an earlier one (policy.kept_new_tokens)."""
    if reusable_len is None:
        return extend_end
    return prefix_len + kept_new_tokens(
        prefix_len, extend_end - prefix_len, total_len, reusable_len
    )


def packed_len(
    ids: Sequence[int],
    matched: int,
    cap: int,
    leader_ids: Sequence[int],
    leader_kept_end: int,
) -> int:
    """How many leading tokens of a prompt (`ids`, of which `matched` are cached) it can
    read from a leader of the same extend batch: their common prefix within the leader's
    kept tokens and the request's own prefix cap. 0 when that adds fewer than
    MIN_PACKED_TOKENS to the match."""
    limit = min(cap, leader_kept_end, len(ids), len(leader_ids))
    if limit - matched < MIN_PACKED_TOKENS:
        return 0
    own = np.asarray(ids[matched:limit], dtype=np.int64)
    theirs = np.asarray(leader_ids[matched:limit], dtype=np.int64)
    differ = np.flatnonzero(own != theirs)
    common = matched + (int(differ[0]) if len(differ) else limit - matched)
    return common if common - matched >= MIN_PACKED_TOKENS else 0
