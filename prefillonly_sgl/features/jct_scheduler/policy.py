"""JCT-aware scheduling: shortest remaining job first on the job-time model, with aging,
prefix groups and batch formation (plain Python + numpy; the SGLang side only feeds it and
applies the batch it returns, see jct_scheduler/).

The policy keeps the waiting requests between steps (`add` when one arrives, `discard`
when it leaves, `set_cached` / `set_group_cached` when the prefix cache changes what it
holds of them) and, before every prefill batch, `plan_step(now)` picks the next batch.
`plan(jobs)` does all of that from a list of Job descriptions (tests, simulations).

Priority (lowest first): predicted remaining seconds - aging * seconds waited. A request
waiting behind ever-shorter ones overtakes them once it has waited about
(its time - theirs) / aging, so aging bounds starvation.

Prefix groups (prefix_marks.py): requests sharing a reusable prefix the cache does not hold
pay for it once. The group's cheapest member leads: it computes the prefix; the others are
predicted as the cache hits they become. With packing (the default, pack_followers) they
ride in the leader's batch, right behind it, reading the prefix the leader computes in the
same forward (prefill_kv/packing.py): one forward per group, not two; without it they wait
until the prefix is cached. The leader's priority is the group's mean time per request
(its own cold time plus the followers' hit times, over the group's size), aged by the
group's longest wait: a group of many cheap followers is worth starting early (Smith's
rule).

Batches: the head (best priority) decides. A long request (its own work above long_factor
per-batch costs: batching would amortise nothing and only delay the others) runs alone,
but for its riding followers (up to a token budget of their own). Otherwise the following
requests in priority order join, each leader with all its riders or not at all, while they
fit the token budget, are not long, are within size_ratio of the head's work (no short
request behind a long one) and share no uncached prefix with a member of another group.

Cost per step: a few numpy operations over the waiting requests plus Python work for the
batch's candidates only (at most SCAN), so a step stays well under a millisecond at a
thousand waiting requests (benchmarks/jct_scheduler_overhead.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from prefillonly_sgl.features.jct_scheduler.jct_model import MIN_SECONDS, JctModel
from prefillonly_sgl.features.jct_scheduler.prefix_marks import MIN_SHARED_TOKENS, PrefixMarks

DEFAULT_AGING = 1.0  # seconds of priority per second waited: waits stay within ~own time
DEFAULT_LONG_FACTOR = 8.0
DEFAULT_SIZE_RATIO = 4.0
SCAN = 256  # candidates looked at for one batch, in priority order


@dataclass
class Job:
    """A waiting request as `plan` takes it."""

    key: Hashable  # the request's id
    tokens: int  # prompt length
    cached: int  # prompt tokens the prefix cache holds now
    waited: float  # seconds since it joined the queue
    marks: PrefixMarks | None = None  # its reusable prefix; None: shares nothing


@dataclass(frozen=True)
class Plan:
    """The next prefill batch (request keys, in the order to admit them) and, when asked
    for (explain=True), every waiting request's predicted remaining seconds.

    What queue-aware eviction (eviction.py) weighs the batch by: its new tokens, those of
    them in uncached reusable prefixes (what prefill-only KV keeps in the pool), how long
    its head has waited and its predicted seconds, and how many waiting requests are cache
    hits on a prefix group's cached prefix."""

    batch: list[Hashable]
    predicted: dict[Hashable, float] = field(default_factory=dict)
    new_tokens: int = 0
    new_prefix_tokens: int = 0
    head_waited: float = 0.0
    head_seconds: float = 0.0
    hits: int = 0


class _Columns:
    """Per-request numbers in numpy arrays, one slot per waiting request."""

    def __init__(self, capacity: int = 64) -> None:
        self.tokens = np.zeros(capacity, np.int64)
        self.cached = np.zeros(capacity, np.int64)  # own matches (requests outside groups)
        self.entered = np.zeros(capacity, np.float64)
        self.group = np.full(capacity, -1, np.int64)
        self.alive = np.zeros(capacity, bool)

    def grow(self) -> None:
        for name in ("tokens", "cached", "entered", "group", "alive"):
            old = getattr(self, name)
            new = np.full(2 * len(old), -1 if name == "group" else 0, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)


@dataclass
class _Group:
    marks: PrefixMarks
    members: int = 0


class JctPolicy:
    def __init__(
        self,
        model: JctModel,
        aging: float = DEFAULT_AGING,
        token_budget: int = 16384,
        long_factor: float = DEFAULT_LONG_FACTOR,
        size_ratio: float = DEFAULT_SIZE_RATIO,
        max_batch: int = 256,
        pack_followers: bool = True,
    ) -> None:
        if aging < 0:
            raise ValueError(f"aging must be >= 0 (seconds per second waited), got {aging}")
        self.model = model
        self.aging = aging
        self.token_budget = max(1, token_budget)
        self.long_factor = long_factor
        self.size_ratio = size_ratio
        self.max_batch = max_batch
        self.pack_followers = pack_followers
        self._cols = _Columns()
        self._slot: dict[Hashable, int] = {}
        self._keys: list[Hashable] = []
        self._free: list[int] = []
        self._groups: list[_Group | None] = []  # by group id; None: free for reuse
        self._group_id: dict[tuple[int, int], int] = {}
        self._free_groups: list[int] = []
        self._group_cached = np.zeros(0, np.int64)
        self._group_reusable = np.zeros(0, np.int64)
        self._level_groups: dict[tuple[int, int], set[int]] = {}  # prefix level -> groups
        # Prefix levels of the last planned batch: with overlapped scheduling the next
        # step is planned before that batch's prefixes reach the cache.
        self._in_flight_levels: set[tuple[int, int]] = set()
        self._in_flight_keys: set[Hashable] = set()
        self._next_use = np.zeros(0)  # per group: its best priority key at the last plan

    # -- the waiting requests ---------------------------------------------------------------
    def __contains__(self, key: Hashable) -> bool:
        return key in self._slot

    def __len__(self) -> int:
        return len(self._slot)

    def keys(self):
        return self._slot.keys()

    def add(self, key: Hashable, tokens: int, entered: float, marks: PrefixMarks | None) -> None:
        """A request joins the queue at time `entered` (seconds, the caller's clock)."""
        if key in self._slot:
            return
        if self._free:
            slot = self._free.pop()
            self._keys[slot] = key
        else:
            slot = len(self._keys)
            self._keys.append(key)
            if slot >= len(self._cols.tokens):
                self._cols.grow()
        cols = self._cols
        cols.tokens[slot], cols.cached[slot], cols.entered[slot] = tokens, 0, entered
        cols.group[slot] = self._group_of(marks) if marks is not None else -1
        cols.alive[slot] = True
        self._slot[key] = slot

    def discard(self, key: Hashable) -> None:
        slot = self._slot.pop(key, None)
        if slot is None:
            return
        self._cols.alive[slot] = False
        gid = int(self._cols.group[slot])
        if gid >= 0:
            group = self._groups[gid]
            group.members -= 1
            if group.members == 0:  # forget it: a long-running server sees endless prefixes
                del self._group_id[group.marks.group]
                for level in group.marks.levels:
                    self._level_groups[level].discard(gid)
                    if not self._level_groups[level]:
                        del self._level_groups[level]
                self._groups[gid] = None
                self._free_groups.append(gid)
        self._keys[slot] = None
        self._free.append(slot)

    def set_cached(self, key: Hashable, cached: int) -> None:
        """How many of a request's tokens the prefix cache holds now (requests outside
        prefix groups; a group's members share set_group_cached)."""
        self._cols.cached[self._slot[key]] = cached

    def group_of(self, key: Hashable) -> int:
        """The request's prefix group id (-1: none)."""
        return int(self._cols.group[self._slot[key]])

    def groups_sharing(self, keys) -> set[int]:
        """The prefix groups that share a prefix level with any of the requests `keys`
        (their own groups included): after those requests ran, the cache may hold more of
        these groups' prefixes."""
        found = set()
        for key in keys:
            slot = self._slot.get(key)
            gid = -1 if slot is None else int(self._cols.group[slot])
            if gid >= 0:
                for level in self._groups[gid].marks.levels:
                    found |= self._level_groups.get(level, set())
        return found

    def group_marks(self, gid: int) -> PrefixMarks:
        """A live prefix group's reusable-prefix marks (marks.group identifies it)."""
        return self._groups[gid].marks

    def live_groups(self) -> list[int]:
        """The ids of the prefix groups with waiting members."""
        return [gid for gid, group in enumerate(self._groups) if group is not None]

    def set_group_cached(self, gid: int, cached: int) -> None:
        """How many tokens of the group's reusable prefix the prefix cache holds now."""
        self._group_cached[gid] = cached

    def _group_of(self, marks: PrefixMarks) -> int:
        gid = self._group_id.get(marks.group)
        if gid is None:
            if self._free_groups:
                gid = self._free_groups.pop()
                self._groups[gid] = _Group(marks)
            else:
                gid = len(self._groups)
                self._groups.append(_Group(marks))
                self._group_cached = np.append(self._group_cached, 0)
                self._group_reusable = np.append(self._group_reusable, 0)
            self._group_id[marks.group] = gid
            self._group_cached[gid] = 0  # until the caller matches it
            self._group_reusable[gid] = marks.length
            for level in marks.levels:
                self._level_groups.setdefault(level, set()).add(gid)
        self._groups[gid].members += 1
        return gid

    # -- the plan ----------------------------------------------------------------------------
    def plan(self, jobs: Sequence[Job], hits_only: bool = False) -> Plan:
        """The next batch for exactly these waiting requests (tests and simulations: the
        policy is brought in line with `jobs`, then plans with explanations)."""
        present = {job.key for job in jobs}
        for key in [k for k in self._slot if k not in present]:
            self.discard(key)
        for job in jobs:
            self.add(job.key, job.tokens, -job.waited, job.marks)
            self._cols.entered[self._slot[job.key]] = -job.waited
            gid = self.group_of(job.key)
            if gid >= 0:
                self.set_group_cached(gid, min(job.cached, job.marks.length))
            else:
                self.set_cached(job.key, job.cached)
        return self.plan_step(0.0, explain=True, hits_only=hits_only)

    def plan_step(self, now: float, explain: bool = False, hits_only: bool = False) -> Plan:
        """The next prefill batch of the waiting requests, at time `now`; hits_only: of the
        cache hits on prefix groups' cached prefixes only (eviction.defer_for_hits)."""
        slots = np.flatnonzero(self._cols.alive)
        if len(slots) == 0:
            return Plan([])
        s = _Step(self, slots, now)
        hit = s.hit_mask()
        if hits_only:
            s.candidates = s.candidates[hit[s.candidates]]
        ranked = s.ranked()
        batch = self._batch(s, ranked)
        self._remember_next_use(s)
        self._in_flight_levels = {lv for i in batch for lv in s.conflicts(i)}
        self._in_flight_keys = {self._keys[slots[i]] for i in batch}
        keys = [self._keys[slots[i]] for i in batch]
        predicted = (
            {self._keys[slot]: float(r) for slot, r in zip(slots, s.remaining)} if explain else {}
        )
        if not batch:
            return Plan(keys, predicted, hits=int(hit.sum()))
        head = batch[0]
        return Plan(
            keys,
            predicted,
            new_tokens=int(s.batch_new[batch].sum()),
            new_prefix_tokens=s.new_prefix_tokens(batch),
            head_waited=float(now - self._cols.entered[slots[head]]),
            head_seconds=float(s.remaining[head]),
            hits=int(hit.sum()),
        )

    def _remember_next_use(self, s: _Step) -> None:
        """Each waiting group's best priority key this step: how soon its prefix is used."""
        best = np.full(len(self._groups), np.inf)
        grouped = np.flatnonzero(s.group >= 0)
        np.minimum.at(best, s.group[grouped], s.key[grouped])
        self._next_use = best

    def group_next_use(self) -> dict[int, float]:
        """Live prefix groups -> their best member's priority key at the last plan (lower:
        sooner), the order queue-aware eviction keeps their prefixes in (eviction.py)."""
        best = self._next_use
        return {gid: float(best[gid]) if gid < len(best) else np.inf for gid in self.live_groups()}

    def _batch(self, s: _Step, ranked: list[int]) -> list[int]:
        if not ranked:
            return []
        # Python numbers for the candidates (numpy scalars are slow in a loop)
        new = s.new[ranked].tolist()
        work = s.work[ranked].tolist()
        long = s.long_mask(ranked).tolist()
        if long[0]:
            return [ranked[0], *s.riders(ranked[0], self.token_budget, self.max_batch - 1)]
        per_batch = self.model.per_batch
        batch, budget = [ranked[0]], self.token_budget - new[0]
        taken = set(s.conflicts(ranked[0]))
        ceiling = self.size_ratio * max(work[0], per_batch)
        budget = self._add_riders(s, ranked[0], batch, budget)
        for j in range(1, len(ranked)):
            if len(batch) >= self.max_batch or budget <= 0:
                break
            # A leader joins with all its riders or not at all: a group split across
            # batches finishes a forward later (its other members wait for the prefix
            # to be cached), and a request ends with its last item (the H200's items
            # shape, issue 73: 27% of ours' forwards carried a split group's rest).
            if s.group_new(ranked[j]) > budget or long[j] or max(work[j], per_batch) > ceiling:
                continue
            conflicts = s.conflicts(ranked[j])
            if taken.intersection(conflicts):
                continue
            batch.append(ranked[j])
            budget -= new[j]
            taken.update(conflicts)
            budget = self._add_riders(s, ranked[j], batch, budget)
        return batch

    def _add_riders(self, s: _Step, leader: int, batch: list[int], budget: int) -> int:
        """Appends the leader's riding followers that fit; returns the budget left."""
        riders = s.riders(leader, budget, self.max_batch - len(batch))
        batch.extend(riders)
        return budget - int(s.batch_new[riders].sum()) if riders else budget


class _Step:
    """One step's numbers over the waiting requests (index i = position in `slots`)."""

    def __init__(self, policy: JctPolicy, slots: np.ndarray, now: float) -> None:
        self.policy = policy
        self.slots = slots
        m = policy.model
        cols = policy._cols
        tokens = cols.tokens[slots]
        group = cols.group[slots]
        grouped = group >= 0
        cached = np.where(grouped, _by_group(policy._group_cached, group), cols.cached[slots])
        cached = np.minimum(cached, tokens)
        self.new = tokens - cached
        self.work = _work(m, self.new, cached)
        self.remaining = m.per_batch + self.work
        rank_time = self.remaining.copy()
        waited = now - cols.entered[slots]
        self.group, self.cached = group, cached
        # What each request computes if it runs in the next batch (a rider: its own
        # tokens after the group's prefix); and, per leader, its riders.
        self.batch_new = self.new.copy()
        self._riders: dict[int, list[int]] = {}
        # Groups whose shared prefix the cache lacks: one leader, the others follow.
        reusable = _by_group(policy._group_reusable, group)
        open_group = grouped & (reusable - cached >= MIN_SHARED_TOKENS)
        blocked = np.zeros(len(slots), bool)
        members = np.flatnonzero(open_group)
        if len(members):
            g = group[members]
            order = members[np.lexsort((-waited[members], self.work[members], g))]
            first = np.ones(len(order), bool)
            first[1:] = group[order][1:] != group[order][:-1]
            leaders, followers = order[first], order[~first]
            blocked[followers] = True
            # followers: the leader's time, then their own time as a cache hit
            fg = group[followers]
            hit_new = tokens[followers] - reusable[followers]
            hit = m.per_batch + _work(m, hit_new, reusable[followers])
            lead_of = np.full(len(policy._groups), -1, np.int64)
            lead_of[group[leaders]] = leaders
            self.remaining[followers] = self.remaining[lead_of[fg]] + hit
            size = np.bincount(group[members], minlength=len(policy._groups))
            hits = np.bincount(fg, weights=hit, minlength=len(policy._groups))
            lg = group[leaders]
            rank_time[leaders] = (self.remaining[leaders] + hits[lg]) / size[lg]
            longest = np.full(len(policy._groups), -np.inf)
            np.maximum.at(longest, g, waited[members])
            waited = waited.copy()
            waited[leaders] = longest[lg]
            blocked |= self._in_flight(open_group, group)
            if policy.pack_followers:
                self._plan_riders(leaders, followers, hit_new, hit, blocked)
        self.key = rank_time - policy.aging * waited
        self.candidates = np.flatnonzero(~blocked)

    def _plan_riders(self, leaders, followers, hit_new, hit, blocked) -> None:
        """Each free leader's followers, cheapest first: they may ride in its batch (a
        leader held back by the batch in flight holds its group back with it)."""
        free = {int(self.group[i]): int(i) for i in leaders.tolist() if not blocked[i]}
        for k in np.argsort(hit, kind="stable").tolist():
            leader = free.get(int(self.group[followers[k]]))
            if leader is not None:
                self._riders.setdefault(leader, []).append(int(followers[k]))
                self.batch_new[followers[k]] = hit_new[k]

    def group_new(self, leader: int) -> int:
        """What a request computes in a batch with all of its riders (its own new
        tokens alone where it leads none)."""
        return int(self.batch_new[leader]) + sum(
            int(self.batch_new[i]) for i in self._riders.get(leader, ())
        )

    def riders(self, leader: int, budget: int, room: int) -> list[int]:
        """The leader's riders that fit `budget` new tokens and `room` places."""
        chosen = []
        for i in self._riders.get(leader, ()):
            if len(chosen) >= room:
                break
            cost = int(self.batch_new[i])
            if cost > budget:
                continue
            chosen.append(i)
            budget -= cost
        return chosen

    def _in_flight(self, open_group: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Members of groups whose uncached prefix the batch in flight is computing (that
        batch's own members excepted: they are still waiting if SGLang refused them)."""
        policy = self.policy
        busy = set()
        for level in policy._in_flight_levels:
            for gid in policy._level_groups.get(level, ()):
                if level[0] - policy._group_cached[gid] >= MIN_SHARED_TOKENS:
                    busy.add(gid)  # that prefix level is still not cached for it
        if not busy:
            return np.zeros(len(group), bool)
        blocked = open_group & np.isin(group, list(busy))
        for i in np.flatnonzero(blocked):
            if policy._keys[self.slots[i]] in policy._in_flight_keys:
                blocked[i] = False
        return blocked

    def _levels(self, gid: int) -> list[tuple[int, int]]:
        return self.policy._groups[gid].marks.uncached_levels(int(self.policy._group_cached[gid]))

    def hit_mask(self) -> np.ndarray:
        """Requests whose prefix group's reusable prefix the cache holds (cache hits)."""
        reusable = _by_group(self.policy._group_reusable, self.group)
        return (self.group >= 0) & (self.cached > 0) & (reusable - self.cached < MIN_SHARED_TOKENS)

    def new_prefix_tokens(self, batch: list[int]) -> int:
        """Uncached reusable-prefix tokens the batch computes, each group's once."""
        seen, total = set(), 0
        reusable = self.policy._group_reusable
        for i in batch:
            gid = int(self.group[i])
            if gid >= 0 and gid not in seen:
                seen.add(gid)
                total += max(0, int(reusable[gid]) - int(self.cached[i]))
        return total

    def conflicts(self, i: int) -> list[tuple[int, int]]:
        """The uncached prefix levels request i would compute."""
        gid = int(self.group[i])
        return self._levels(gid) if gid >= 0 else []

    def long_mask(self, idx) -> np.ndarray:
        """Long requests (run alone) among idx."""
        p = self.policy
        return (self.new[idx] > p.token_budget) | (
            self.work[idx] > p.long_factor * p.model.per_batch
        )

    def ranked(self) -> list[int]:
        """Up to SCAN unblocked requests, best priority first."""
        c = self.candidates
        if len(c) > SCAN:
            c = c[np.argpartition(self.key[c], SCAN)[:SCAN]]
        return [int(i) for i in c[np.argsort(self.key[c], kind="stable")]]


def _by_group(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """values[group] per request (0 for requests in no group)."""
    if len(values) == 0:
        return np.zeros(len(group), values.dtype)
    return np.where(group >= 0, values[np.maximum(group, 0)], 0)


def _work(model: JctModel, new: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """JctModel.work over arrays."""
    new = new.astype(np.float64)
    work = (
        model.per_token * new
        + model.per_token_cached * new * cached
        + model.per_token_squared * new * new
    )
    return np.where(new > 0, np.maximum(work, MIN_SECONDS), 0.0)
