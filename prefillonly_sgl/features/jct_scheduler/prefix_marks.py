"""What a waiting request shares with others (plain Python): hashes of its reusable prefix.

A score prompt's reusable prefix is its first R tokens (features/prefill_kv/policy.py: the
query's tokens).
Requests with the same reusable prefix form a *prefix group* (one user's items, one score
call's items): while that prefix is not cached, the first of them to run computes it and
the others become cache hits. Requests may also share a shorter prefix (a few-shot
instruction common to every user); computing it twice in one batch is the waste the
scheduler avoids, so each request carries hashes of its first L tokens for L = 64, 128,
256, ... below R, and R itself, computed once when the request is first seen.

    marks.levels = ((64, h64), (128, h128), ..., (R, hR))   # hR identifies the group

The hashes cover the request's cache namespace too (SGLang's extra_key and cache_salt,
scoring/cache_salts.py): requests of different namespaces never share a cached prefix, so they
never form one group or share a level; grouping them would have the "followers" wait for
a prefix they cannot reuse.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MIN_SHARED_TOKENS = 64  # shorter shared prefixes are not worth scheduling around


@dataclass(frozen=True)
class PrefixMarks:
    length: int  # R: the reusable prefix's tokens
    levels: tuple[tuple[int, int], ...]  # (L, hash of the first L tokens), L ascending

    @property
    def group(self) -> tuple[int, int]:
        """Requests with the same reusable prefix have the same group."""
        return self.levels[-1]

    def uncached_levels(self, cached: int) -> list[tuple[int, int]]:
        """The levels that reach MIN_SHARED_TOKENS past what the cache holds: a request
        sharing one of them would compute that much again in the same batch."""
        return [(n, h) for n, h in self.levels if n - cached >= MIN_SHARED_TOKENS]


def prefix_marks(
    token_ids: Sequence[int], reusable_len: int | None, namespace: Hashable = None
) -> PrefixMarks | None:
    """None when the request shares nothing worth grouping (no or a short prefix).
    namespace: the request's cache namespace (None: SGLang's default one)."""
    if not reusable_len or reusable_len < MIN_SHARED_TOKENS:
        return None
    length = min(int(reusable_len), len(token_ids))
    sizes = []
    size = MIN_SHARED_TOKENS
    while size < length:
        sizes.append(size)
        size *= 2
    sizes.append(length)
    # Hashes of the raw bytes: C speed (SGLang's token ids are an array of int64 already).
    if not (isinstance(token_ids, array) and token_ids.typecode == "q"):
        token_ids = array("q", token_ids[:length])
    data = token_ids[:length].tobytes()
    if namespace is None:
        levels = tuple((n, hash(data[: 8 * n])) for n in sizes)
    else:
        levels = tuple((n, hash((namespace, data[: 8 * n]))) for n in sizes)
    return PrefixMarks(length=length, levels=levels)
