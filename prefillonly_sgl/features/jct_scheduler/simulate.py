"""A discrete-event simulation of one engine's prefill queue under a policy (plain Python):
for unit tests, for tuning aging before a deployment, and for measuring the policy's own
cost per step without SGLang.

Requests arrive at given times; every step the policy plans a batch from what is waiting;
the batch takes `truth.batch_time(...)` seconds (a JctModel: the same as the policy's, or a
different one to see how wrong predictions hurt); a member behind an earlier member of the
same prefix group computes only its own tokens (packed behind its leader, as
prefill_kv/packing.py runs it); when the batch ends, each member's reusable prefix is
cached (prefill-only KV keeps exactly that), so later requests sharing it are cache hits.

The cache never evicts, unless given a `capacity` in tokens: then it holds whole reusable
prefixes, and a batch's new prefixes evict others first, under `eviction` "lru" (least
recently used: SGLang's radix cache) or "queue" (queue-aware, eviction.py: what no waiting
request will hit first, the waiting groups' prefixes last in the policy's order, and the
waiting hits run before a batch would evict their prefix).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefillonly_sgl.features.jct_scheduler.eviction import (
    EVICTION_POLICIES,
    defer_for_hits,
    evict_protected_last,
    release_order,
)
from prefillonly_sgl.features.jct_scheduler.jct_model import JctModel
from prefillonly_sgl.features.jct_scheduler.policy import Job
from prefillonly_sgl.features.jct_scheduler.prefix_marks import PrefixMarks, prefix_marks


@dataclass(frozen=True)
class SimRequest:
    key: str
    arrival: float  # seconds
    token_ids: tuple[int, ...]
    reusable_len: int = 0  # R: the prefix later requests may share


@dataclass(frozen=True)
class SimResult:
    finished: dict[str, float]  # key -> completion time
    order: list[str]  # keys in completion order (batch members in plan order)
    batches: list[list[str]]
    computed_tokens: int  # tokens actually prefilled (cache hits excluded)
    plan_seconds: list[float]  # wall time of each policy.plan call
    prompt_tokens: int = 0  # every request's prompt tokens together
    evicted_tokens: int = 0  # cached prefix tokens evicted (a bounded cache)

    @property
    def hit_share(self) -> float:
        """Prompt tokens served from the cache, as a share of all prompt tokens."""
        return 1 - self.computed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def latency(self, requests: Sequence[SimRequest]) -> dict[str, float]:
        return {r.key: self.finished[r.key] - r.arrival for r in requests}


def request(key, arrival, prefix_tokens: Sequence[int], item_tokens: Sequence[int]):
    """A score request: a shared prefix (reusable) followed by its own item tokens."""
    ids = tuple(prefix_tokens) + tuple(item_tokens)
    return SimRequest(key, float(arrival), ids, len(prefix_tokens))


def simulate(
    policy,
    requests: Sequence[SimRequest],
    truth: JctModel | None = None,
    capacity: int | None = None,
    eviction: str = "lru",
    packed: bool = True,
) -> SimResult:
    """packed=False: every member of a batch computes its own uncached tokens (stock
    SGLang, which shares nothing within a batch)."""
    truth = truth or policy.model
    if eviction not in EVICTION_POLICIES:
        raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
    pending = sorted(requests, key=lambda r: r.arrival)
    marks: dict[str, PrefixMarks | None] = {
        r.key: prefix_marks(r.token_ids, r.reusable_len) for r in requests
    }
    cache = _Cache(capacity)
    waiting: list[SimRequest] = []
    finished: dict[str, float] = {}
    order, batches, plan_seconds = [], [], []
    computed, now, i = 0, 0.0, 0
    while i < len(pending) or waiting:
        while i < len(pending) and pending[i].arrival <= now:
            waiting.append(pending[i])
            i += 1
        if not waiting:
            now = pending[i].arrival
            continue
        jobs = [
            Job(r.key, len(r.token_ids), cache.cached(marks[r.key]), now - r.arrival,
                marks[r.key])
            for r in waiting
        ]  # fmt: skip
        started = time.perf_counter()
        plan = policy.plan(jobs)
        if capacity is not None and eviction == "queue":
            room = cache.room(_waiting_groups(policy, plan.batch))
            if defer_for_hits(
                plan.new_prefix_tokens, room, plan.head_waited, plan.head_seconds, plan.hits
            ):
                plan = policy.plan(jobs, hits_only=True)
        plan_seconds.append(time.perf_counter() - started)
        if not plan.batch:  # everything waits for a prefix in flight: never in a simulation
            raise RuntimeError("the policy planned an empty batch with nothing in flight")
        by_key = {job.key: job for job in jobs}
        members = [by_key[k] for k in plan.batch]
        if capacity is not None:  # room for the batch's new prefixes, before it runs
            protected = _waiting_groups(policy, plan.batch) if eviction == "queue" else []
            cache.make_room(members, protected)
        new = _new_tokens(members) if packed else [j.tokens - j.cached for j in members]
        now += truth.batch_time((n, j.tokens) for n, j in zip(new, members))
        computed += sum(new)
        for job in members:
            finished[job.key] = now
            order.append(job.key)
            cache.add(job.marks, now)
        batches.append([j.key for j in members])
        done = set(plan.batch)
        waiting = [r for r in waiting if r.key not in done]
    prompt = sum(len(r.token_ids) for r in requests)
    return SimResult(finished, order, batches, computed, plan_seconds, prompt, cache.evicted)


def _new_tokens(members: list[Job]) -> list[int]:
    """What each member of a batch computes: its uncached tokens, or, behind an earlier
    member of its prefix group (a packed follower), those after the group's prefix."""
    computing: set[tuple[int, int]] = set()
    new = []
    for job in members:
        cached = job.cached
        if job.marks is not None:
            if job.marks.group in computing:
                cached = max(cached, job.marks.length)
            computing.add(job.marks.group)
        new.append(job.tokens - cached)
    return new


def _waiting_groups(policy, batch) -> list[tuple[int, int]]:
    """The waiting prefix groups outside `batch`, in release order (eviction.py)."""
    running = {policy.group_of(key) for key in batch}
    next_use = {gid: use for gid, use in policy.group_next_use().items() if gid not in running}
    return [policy.group_marks(gid).group for gid in release_order(next_use)]


class _Cache:
    """Cached prefixes: unbounded by prefix level (capacity None), or whole reusable
    prefixes within `capacity` tokens, each with its last use."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.levels: set[tuple[int, int]] = set()
        self.entries: dict[tuple[int, int], list] = {}  # group -> [tokens, last used]
        self.evicted = 0

    def cached(self, marks: PrefixMarks | None) -> int:
        if marks is None:
            return 0
        if self.capacity is None:
            return max((n for n, h in marks.levels if (n, h) in self.levels), default=0)
        return marks.length if marks.group in self.entries else 0

    def used(self) -> int:
        return sum(tokens for tokens, _ in self.entries.values())

    def room(self, protected: list[tuple[int, int]]) -> int:
        """Tokens to be had without evicting the `protected` groups' prefixes."""
        kept = sum(self.entries[g][0] for g in protected if g in self.entries)
        return self.capacity - kept

    def make_room(self, members: list[Job], protected: list[tuple[int, int]]) -> None:
        new = {j.marks.group: j.marks.length for j in members if j.marks and not j.cached}
        need = sum(n for n in new.values() if n <= self.capacity) - (self.capacity - self.used())
        if need <= 0:
            return
        held = {g for g in protected if g in self.entries}
        running = {j.marks.group for j in members if j.marks}  # in use: never evicted

        def evict(tokens: int) -> int:
            freed = 0
            for group in sorted(self.entries, key=lambda g: self.entries[g][1]):
                if freed >= tokens:
                    break
                if group not in held and group not in running:
                    freed += self.entries.pop(group)[0]
            self.evicted += freed
            return freed

        evict_protected_last(need, [g for g in protected if g in held], evict, held.discard)

    def add(self, marks: PrefixMarks | None, now: float) -> None:
        if marks is None:
            return
        if self.capacity is None:
            self.levels.update(marks.levels)
        elif marks.group in self.entries:
            self.entries[marks.group][1] = now
        elif marks.length <= self.capacity - self.used():
            self.entries[marks.group] = [marks.length, now]
