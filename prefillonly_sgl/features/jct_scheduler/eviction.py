"""Queue-aware eviction (plain Python): under memory pressure the prefix cache serves the
queue. SGLang's radix cache evicts least recently used leaves and knows nothing of the
requests waiting to run; a profile that fifty waiting items will hit is as evictable as
one nobody will read again. The JCT scheduler knows both, so:

1. What no waiting request will hit goes first, in the cache's own order (LRU).
2. Prefixes that waiting requests will hit go last, and among them the one whose next use
   is furthest away first (the scheduler's priority order of their groups: Belady's rule
   with the queue as the future).
3. Before a batch evicts a prefix that waiting requests will hit, those hits run
   (`defer_for_hits`): they are cheap, and once they ran the prefix is free to go. A
   request is deferred so only while it has waited less than DEFER_LIMIT times its own
   predicted time, so hits that keep arriving cannot starve it.

The SGLang side (scheduler_process.py) protects the waiting
groups' cached prefixes with the radix cache's own lock counts around its evict, so what
evict may take is exactly what this module says.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TypeVar

EVICTION_POLICIES = ("queue", "lru")  # the JCT scheduler's option jct_eviction
DEFAULT_EVICTION = "queue"
DEFER_LIMIT = 2.0  # a request defers for others' hits while waited < this x its own time

Handle = TypeVar("Handle")


def release_order(next_use: Mapping[Hashable, float]) -> list[Hashable]:
    """Protected prefix groups in the order their protection is given up when nothing
    unprotected is left to evict: the furthest next use (highest priority key) first."""
    return sorted(next_use, key=lambda group: next_use[group], reverse=True)


def evict_protected_last(
    need: int,
    protected: Sequence[Handle],
    evict: Callable[[int], int],
    release: Callable[[Handle], None],
) -> int:
    """Frees `need` tokens with `evict(tokens) -> freed` while the prefixes `protected`
    (already locked, in release order) are held; each time what is unprotected cannot
    free enough, the next protected prefix is released and evict runs again. Every
    protection is released on return (also on an error). Returns the tokens freed."""
    released = 0
    try:
        freed = evict(need)
        while freed < need and released < len(protected):
            release(protected[released])
            released += 1
            freed += evict(need - freed)
        return freed
    finally:
        for handle in protected[released:]:
            release(handle)


def defer_for_hits(need: int, room: int, waited: float, predicted: float, hits: int) -> bool:
    """Whether a batch needing `need` new pool tokens should wait for cache hits: only `room`
    tokens can be had without evicting a prefix that waiting requests will hit, `hits` such
    requests can run now, and the batch's head has waited `waited` seconds against its own
    `predicted` seconds of work."""
    return need > room and hits > 0 and waited < DEFER_LIMIT * max(predicted, 0.0)
