"""JCT-aware scheduling: shortest remaining job first on the job-time model, with aging,
prefix groups and batch formation (plain Python; the SGLang side only feeds it jobs and
applies the batch it returns, see sglang_runtime/jct_scheduler/).

Every scheduling step the scheduler describes each waiting request as a Job, with how many
of its tokens the prefix cache holds *now* (so predictions follow the cache as requests
finish and evict each other), and asks `JctPolicy.plan` for the next prefill batch.

Priority (lowest first): predicted remaining seconds - aging * seconds waited. A request
waiting behind ever-shorter ones overtakes them once it has waited about
(its time - theirs) / aging, so aging bounds starvation.

Prefix groups (prefix_marks.py): requests sharing a reusable prefix the cache does not hold
pay for it once. The group's cheapest member leads: it computes the prefix; the others are
predicted as the cache hits they become and wait until the prefix is cached (never two of
them in one batch). The leader's priority is the group's mean time per request (its own
cold time plus the followers' hit times, over the group's size), aged by the group's
longest wait: a group of many cheap followers is worth starting early, as Smith's rule
says for weighted jobs.

Batches: the head (best priority) decides. A long request (its own work above long_factor
per-batch costs: batching would amortise nothing and only delay the others) runs alone.
Otherwise the following requests in priority order join while they fit the token budget,
are not long, are within size_ratio of the head's work (no short request behind a long one)
and share no uncached prefix with a member.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from prefillonly_sgl.scheduler.jct_model import JctModel
from prefillonly_sgl.scheduler.prefix_marks import PrefixMarks

DEFAULT_AGING = 1.0  # seconds of priority per second waited: waits stay within ~own time
DEFAULT_LONG_FACTOR = 8.0
DEFAULT_SIZE_RATIO = 4.0
SCAN = 512  # candidates looked at for one batch, in priority order


@dataclass
class Job:
    """A waiting request as the policy sees it."""

    key: Hashable  # the request's id
    tokens: int  # prompt length
    cached: int  # prompt tokens the prefix cache holds now
    waited: float  # seconds since it joined the queue
    marks: PrefixMarks | None = None  # its reusable prefix; None: shares nothing


@dataclass(frozen=True)
class Plan:
    """The next prefill batch (job keys, in the order to admit them) and every job's
    predicted remaining seconds (for logs, metrics and tests)."""

    batch: list[Hashable]
    predicted: dict[Hashable, float] = field(default_factory=dict)


@dataclass
class _Entry:
    job: Job
    new: int  # tokens it computes if run now
    work: float  # its share of a batch's seconds
    remaining: float  # predicted seconds until it is done
    rank_time: float  # the seconds its priority counts (a group leader: the group's mean)
    waited: float  # the wait its priority ages with (a group leader: the group's longest)
    blocked: bool = False  # waits for a prefix another request computes first
    conflicts: list = field(default_factory=list)  # uncached prefix levels it would compute


class JctPolicy:
    def __init__(
        self,
        model: JctModel,
        aging: float = DEFAULT_AGING,
        token_budget: int = 16384,
        long_factor: float = DEFAULT_LONG_FACTOR,
        size_ratio: float = DEFAULT_SIZE_RATIO,
        max_batch: int = 256,
    ) -> None:
        if aging < 0:
            raise ValueError(f"aging must be >= 0 (seconds per second waited), got {aging}")
        self.model = model
        self.aging = aging
        self.token_budget = max(1, token_budget)
        self.long_factor = long_factor
        self.size_ratio = size_ratio
        self.max_batch = max_batch
        # Prefix levels the last planned batch computes: with overlapped scheduling the
        # next step is planned before that batch's prefixes reach the cache.
        self._in_flight: set[tuple[int, int]] = set()
        self._in_flight_keys: set[Hashable] = set()

    # -- the plan --------------------------------------------------------------------------
    def plan(self, jobs: Sequence[Job]) -> Plan:
        entries = [self._entry(job) for job in jobs]
        self._group(entries)
        ranked = heapq.nsmallest(
            min(SCAN, len(entries)),
            (e for e in entries if not e.blocked),
            key=lambda e: e.rank_time - self.aging * e.waited,
        )
        batch = self._batch(ranked)
        self._in_flight = {level for e in batch for level in e.conflicts}
        self._in_flight_keys = {e.job.key for e in batch}
        return Plan(
            batch=[e.job.key for e in batch],
            predicted={e.job.key: e.remaining for e in entries},
        )

    def _entry(self, job: Job) -> _Entry:
        new = max(job.tokens - job.cached, 0)
        work = self.model.work(new, job.tokens)
        conflicts = job.marks.uncached_levels(job.cached) if job.marks else []
        remaining = self.model.per_batch + work
        return _Entry(job, new, work, remaining, remaining, job.waited, False, conflicts)

    def _group(self, entries: list[_Entry]) -> None:
        """Prefix groups: one leader computes the shared prefix, the others wait for it."""
        groups: dict[tuple[int, int], list[_Entry]] = {}
        for e in entries:
            if e.conflicts:
                in_flight = self._in_flight.intersection(e.conflicts)
                if in_flight and e.job.key not in self._in_flight_keys:
                    e.blocked = True  # its prefix is being computed right now
                groups.setdefault(e.job.marks.group, []).append(e)
        for members in groups.values():
            if len(members) < 2:
                continue
            leader = min(members, key=lambda e: (e.work, -e.waited))
            hit = 0.0
            for e in members:
                if e is not leader:
                    # After the leader: a cache hit on the shared prefix.
                    e.work = self.model.work(e.job.tokens - e.job.marks.length, e.job.tokens)
                    e.remaining = leader.remaining + self.model.per_batch + e.work
                    e.blocked = True
                    hit += self.model.per_batch + e.work
            leader.rank_time = (leader.remaining + hit) / len(members)
            leader.waited = max(e.waited for e in members)

    def _long(self, e: _Entry) -> bool:
        return e.new > self.token_budget or e.work > self.long_factor * self.model.per_batch

    def _batch(self, ranked: list[_Entry]) -> list[_Entry]:
        if not ranked:
            return []
        head = ranked[0]
        if self._long(head):
            return [head]
        batch, budget = [head], self.token_budget - head.new
        taken = set(head.conflicts)
        floor = max(head.work, self.model.per_batch)
        for e in ranked[1:]:
            if len(batch) >= self.max_batch or budget <= 0:
                break
            if (
                e.new > budget
                or self._long(e)
                or max(e.work, self.model.per_batch) > self.size_ratio * floor
                or taken.intersection(e.conflicts)
            ):
                continue
            batch.append(e)
            budget -= e.new
            taken.update(e.conflicts)
        return batch
