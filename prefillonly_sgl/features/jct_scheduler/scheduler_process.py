"""JCT scheduler, scheduler side: SGLang's ordering replaced by policy.py.

Settings (settings.py) come from the process's runtime configuration
(process_state.py), which the Engine or `serve` resolved. Hooks, all on SGLang's own
extension points:

- Scheduler.init_schedule_policy (AFTER): the scheduler's SchedulePolicy becomes
  JctSchedulePolicy. Its calc_priority, which SGLang calls before every prefill batch,
  brings the policy's waiting set in line with SGLang's queue (requests seen for the first
  time are described once: prompt tokens, arrival, reusable-prefix marks), refreshes what
  the radix cache holds of them, asks for the next batch and moves it to the queue's head.
- Scheduler.get_prefill_adder_class (AFTER): the PrefillAdder SGLang builds for the batch
  admits only the planned requests (the first other request ends the batch), still under
  SGLang's own memory and token budgets; a planned batch of whole one-forward prompts may
  pass the chunk budget up to the batch budget (batch_budget.py: on CUDA,
  max_prefill_tokens).
- RadixCache.evict (AFTER): counts evictions, so the cache is matched again in full only
  after one. SGLang 0.5.23 builds a UnifiedRadixCache instead unless asked otherwise,
  which is not counted: then every group is matched each step (which also refreshes the
  waiting groups' prefixes in the cache's LRU order).
- UnifiedRadixCache.evict_for_alloc (AROUND), with queue-aware eviction (jct_eviction
  "queue", eviction.py): the allocator's eviction runs with the waiting prefix
  groups' cached prefixes locked (the cache's own TreeLocks: evict skips locked nodes),
  released one at a time, furthest next use first, only when what is unprotected cannot
  free enough.

Queue-aware eviction also weighs each planned batch before SGLang admits it: when its new
pool tokens exceed what is free plus what can be evicted without touching a waiting
group's prefix, the waiting cache hits run first (eviction.defer_for_hits).

Matching against the radix cache (the cost that grows with the queue): requests of a prefix
group share its reusable prefix, so the group is matched, not its members, and only when
the cache may have changed for it: each step matches the groups that are new and those
sharing a prefix level with the last two batches (their prefixes are cached now; two, as
with overlapped scheduling a batch finishes a step later); after an eviction, every
group. Requests outside groups: new ones and MATCHES_PER_STEP others in rotation. SGLang
matches the requests it admits again itself (init_next_round_input), so a stale estimate
only affects the order, never what is computed.

Debugging: PREFILLONLY_SCHEDULER_LOG=<file> appends one "jct_scheduler.plan" event per
step (hooking/events.py): every waiting request's predicted seconds and the batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sglang.srt.managers.schedule_policy import AddReqResult, SchedulePolicy
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from prefillonly_sgl.features.jct_scheduler.batch_budget import batch_token_budget, chunk_lift
from prefillonly_sgl.features.jct_scheduler.call_arrival import CallArrivals
from prefillonly_sgl.features.jct_scheduler.eviction import (
    defer_for_hits,
    evict_protected_last,
    release_order,
)
from prefillonly_sgl.features.jct_scheduler.policy import JctPolicy
from prefillonly_sgl.features.jct_scheduler.prefix_marks import prefix_marks
from prefillonly_sgl.features.jct_scheduler.settings import JctSettings
from prefillonly_sgl.features.prefill_kv.messages import call_in, grouping_len_in
from prefillonly_sgl.features.prefill_kv.policy import runs_one_forward
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event

logger = logging.getLogger(__name__)

MATCHES_PER_STEP = 16  # requests outside groups matched again per step, in rotation


@dataclass(frozen=True)
class _Prefix:
    """What matching needs: the tokens (a group's reusable prefix, or a whole prompt) and
    the request's cache namespace."""

    token_ids: object  # array of ints
    extra_key: object
    cache_salt: object
    group: tuple[int, int] | None = None  # PrefixMarks.group (group ids are reused)


class JctSchedulePolicy(SchedulePolicy):
    """SGLang's SchedulePolicy with calc_priority planned by JctPolicy."""

    def __init__(self, scheduler, settings: JctSettings) -> None:
        super().__init__(
            "fcfs",
            scheduler.tree_cache,
            scheduler.enable_hierarchical_cache,
            scheduler.enable_priority_scheduling,
            scheduler.schedule_low_priority_values_first,
        )
        budget = batch_token_budget(
            settings.batch_tokens, scheduler.max_prefill_tokens, scheduler.chunked_prefill_size
        )
        # how far a batch of whole one-forward prompts reaches past SGLang's chunk budget
        # (batch_budget.py); `lift` is this step's, read by the planned adder
        self.chunk_lift = chunk_lift(budget, scheduler.chunked_prefill_size)
        self.lift = 0
        self.jct = JctPolicy(
            settings.model,
            aging=settings.aging,
            token_budget=budget,
            long_factor=settings.long_factor,
            size_ratio=settings.size_ratio,
        )
        self.planned: set[str] | None = None  # rids the adder may admit this step
        self.arrivals = CallArrivals()  # a score call's prompts admitted together
        self._present: set[str] = set()
        self._requests: dict[str, object] = {}  # rid -> Req, requests outside groups
        self._prefixes: dict[int, _Prefix] = {}  # group id -> its prefix
        self._recent_batches: list[list[str]] = []  # rids of the last two planned batches
        self._rotation = 0
        # Evictions are counted only for SGLang's plain radix cache; others: match all.
        self._state = process_state.current()
        plain_radix = type(self.tree_cache) is RadixCache
        self._evictions_seen = self._state.radix_evictions if plain_radix else None
        # Queue-aware eviction is written against SGLang's default cache (its allocator
        # eviction and TreeLocks); elsewhere SGLang's own order stays.
        self.queue_aware = (
            settings.eviction == "queue" and type(self.tree_cache) is UnifiedRadixCache
        )
        if self.queue_aware:
            self.tree_cache.prefillonly_queue = self  # read by the evict hook below
        logger.info(
            "prefillonly: JCT scheduler (aging %.3g, eviction %s, model %s)",
            settings.aging,
            "queue-aware" if self.queue_aware else "SGLang's",
            settings.model,
        )

    def calc_priority(self, waiting_queue, running_batch=None, processed_tokens=0) -> None:
        if not waiting_queue:
            self.planned = None
            self.lift = 0
            return
        now = time.perf_counter()
        changed = self.jct.groups_sharing(rid for batch in self._recent_batches for rid in batch)
        new_groups, new_outside = self._sync(waiting_queue, now)
        self._match(new_groups + list(changed), new_outside)
        explain = bool(process_state.current().switches.scheduler_log)
        # Followers ride in their leader's batch where prefill_kv packs them (decided at
        # start-up, after this policy was made).
        self.jct.pack_followers = self._state.prefill_kv.packs_followers
        plan = self.jct.plan_step(now, explain=explain)
        if self.queue_aware:
            plan = self._hits_first(plan, now, explain)
        members = set(plan.batch) - self._arriving(waiting_queue, now)
        position = {rid: i for i, rid in enumerate(plan.batch)}
        head = sorted((r for r in waiting_queue if r.rid in members), key=lambda r: position[r.rid])
        waiting_queue[:] = head + [r for r in waiting_queue if r.rid not in members]
        self.planned = members
        whole = head and all(runs_one_forward(r.sampling_params.max_new_tokens) for r in head)
        self.lift = self.chunk_lift if whole else 0
        self._recent_batches = [*self._recent_batches[-1:], list(plan.batch)]
        _log_plan(plan)

    def _arriving(self, waiting_queue, now: float) -> set[str]:
        """The waiting prompts of score calls whose other prompts are still arriving
        (call_arrival.py): left out of this step's batch."""
        self.arrivals.start_step()
        for req in waiting_queue:
            tag = call_in(req.sampling_params.custom_params)
            if tag is not None:
                self.arrivals.observe(req.rid, tag[0], tag[1], now)
        return self.arrivals.held(now)

    def _sync(self, waiting_queue, now: float) -> tuple[list[int], list[str]]:
        """The policy's waiting set = SGLang's queue. Returns the new groups and the new
        requests outside groups (to match at once)."""
        present = {r.rid for r in waiting_queue}
        for rid in self._present - present:
            self.jct.discard(rid)
            self._requests.pop(rid, None)
        new_groups, new_outside = [], []
        if present - self._present:
            for req in waiting_queue:
                if req.rid in self._present or req.rid in self.jct:
                    continue
                ids = req.origin_input_ids
                marks = prefix_marks(
                    ids,
                    grouping_len_in(req.sampling_params.custom_params),
                    _namespace(req),
                )
                entered = req.time_stats.wait_queue_entry_time or now
                self.jct.add(req.rid, len(ids) + len(req.output_ids), entered, marks)
                gid = self.jct.group_of(req.rid)
                if gid < 0:
                    self._requests[req.rid] = req
                    new_outside.append(req.rid)
                    continue
                known = self._prefixes.get(gid)
                if known is None or known.group != marks.group:
                    prefix = ids[: marks.length]
                    self._prefixes[gid] = _Prefix(
                        prefix, req.extra_key, req.cache_salt, marks.group
                    )
                    new_groups.append(gid)
        self._present = present
        return new_groups, new_outside

    def _match(self, groups: list[int], new_outside: list[str]) -> None:
        """Matches `groups` (new, or where the cache may have changed), or every group
        after an eviction; requests outside groups: the new ones and some in rotation."""
        live = self.jct.live_groups()
        evictions = self._state.radix_evictions
        if self._evictions_seen is None or evictions != self._evictions_seen:
            groups = live  # an eviction may have taken any group's prefix
            self._evictions_seen = None if self._evictions_seen is None else evictions
        for gid in set(groups):
            prefix = self._prefixes.get(gid)
            if prefix is not None:
                self.jct.set_group_cached(gid, self._cached(prefix))
        outside = list(self._requests)
        for rid in set(new_outside) | set(_rotate(outside, self._rotation)):
            req = self._requests[rid]
            whole = _Prefix(req.origin_input_ids, req.extra_key, req.cache_salt)
            self.jct.set_cached(rid, self._cached(whole))
        self._rotation += MATCHES_PER_STEP
        if len(self._prefixes) > 2 * len(live) + 64:  # forget groups that are gone
            alive = set(live)
            self._prefixes = {g: p for g, p in self._prefixes.items() if g in alive}

    def _cached(self, prefix: _Prefix) -> int:
        return self._match_prefix(prefix).device_prefix_len

    def _match_prefix(self, prefix: _Prefix):
        key = RadixKey(
            token_ids=prefix.token_ids, extra_key=prefix.extra_key, cache_salt=prefix.cache_salt
        )
        return self.tree_cache.match_prefix(MatchPrefixParams(key=key))

    # -- queue-aware eviction (eviction.py) ---------------------------------------
    def protect_waiting(self) -> list:
        """Locks the cached prefix of every waiting prefix group in the radix cache (its
        own TreeLocks: evict skips locked nodes); returns the locks in release order,
        furthest next use first. The caller unlocks each (tree_cache.unlock)."""
        next_use = self.jct.group_next_use()
        locked = []
        for gid in release_order(next_use):
            prefix = self._prefixes.get(gid)
            if prefix is None:
                continue
            match = self._match_prefix(prefix)
            self.jct.set_group_cached(gid, match.device_prefix_len)
            if match.device_prefix_len > 0:
                locked.append(self.tree_cache.lock(match.last_device_node))
        return locked

    def _hits_first(self, plan, now: float, explain: bool):
        """The waiting cache hits instead of `plan` when its batch would evict a prefix
        they will hit (eviction.defer_for_hits); else `plan`."""
        if not plan.batch or not plan.hits:
            return plan
        kept_only = process_state.current().prefill_kv.active  # the pool keeps prefixes only
        need = plan.new_prefix_tokens if kept_only else plan.new_tokens
        available = self.tree_cache.token_to_kv_pool_allocator.available_size()
        if need <= available:
            return plan
        locked = self.protect_waiting()
        try:
            room = available + self.tree_cache.evictable_size()
        finally:
            for lock in locked:
                self.tree_cache.unlock(lock)
        if not defer_for_hits(need, room, plan.head_waited, plan.head_seconds, plan.hits):
            return plan
        hits = self.jct.plan_step(now, explain=explain, hits_only=True)
        return hits if hits.batch else plan


def _namespace(req) -> tuple | None:
    """The request's prefix-cache namespace, as SGLang's radix cache keys it (RadixKey's
    extra_key and cache_salt); None for the default one."""
    if req.extra_key is None and req.cache_salt is None:
        return None
    return (req.extra_key, req.cache_salt)


def _rotate(items: list, start: int) -> list:
    """MATCHES_PER_STEP of `items`, from position `start` on (wrapping)."""
    if not items:
        return []
    start %= len(items)
    return (items[start:] + items[:start])[:MATCHES_PER_STEP]


def _log_plan(plan) -> None:
    path = process_state.current().switches.scheduler_log
    if not path:
        return
    append_event(
        path,
        "jct_scheduler.plan",
        predicted={key: round(seconds, 6) for key, seconds in plan.predicted.items()},
        batch=list(plan.batch),
    )


def _planned_adder(base):
    """`base` (SGLang's PrefillAdder class) admitting only the planned requests."""

    class PlannedPrefillAdder(base):
        plan: JctSchedulePolicy | None = None

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # a planned batch of whole one-forward prompts may pass the chunk budget
            # (batch_budget.py); SGLang's own max_prefill_tokens budget still bounds it
            lift = self.plan.lift if self.plan is not None else 0
            if lift and self.rem_chunk_tokens is not None:
                self.rem_chunk_tokens += lift

        def add_one_req(self, req, has_chunked_req, truncation_align_size):
            planned = self.plan.planned if self.plan is not None else None
            if planned is not None and req.rid not in planned:
                return AddReqResult.OTHER  # the planned batch is complete
            return super().add_one_req(req, has_chunked_req, truncation_align_size)

    return PlannedPrefillAdder


def _after_init_schedule_policy(result, self, *args, **kwargs):
    settings = process_state.current().settings("jct_scheduler")
    if settings is not None:
        self.policy = JctSchedulePolicy(self, settings)
    return result


def _after_get_prefill_adder_class(adder_class, self, *args, **kwargs):
    if not isinstance(getattr(self, "policy", None), JctSchedulePolicy):
        return adder_class
    planned = getattr(self, "_prefillonly_planned_adders", None)
    if planned is None:
        planned = self._prefillonly_planned_adders = {}
    if adder_class not in planned:
        planned[adder_class] = _planned_adder(adder_class)
        planned[adder_class].plan = self.policy
    return planned[adder_class]


def _after_evict(result, *args, **kwargs):
    process_state.current().radix_evictions += 1
    return result


def _around_evict_for_alloc(evict_for_alloc, self, params, *args, **kwargs):
    """With queue-aware eviction on this cache: what no waiting request will hit goes
    first, the waiting groups' prefixes last (eviction.py). Other callers (joint reclaim,
    SWA or Mamba components) get SGLang's eviction unchanged."""
    queue = getattr(self, "prefillonly_queue", None)
    full_tokens_only = not (params.swa_num_tokens or params.mamba_num)
    plain = not args and kwargs.get("allocation_reclaim_satisfied") is None
    if queue is None or not plain or not full_tokens_only or params.num_tokens <= 0:
        return evict_for_alloc(self, params, *args, **kwargs)

    def evict_tokens(tokens: int) -> int:
        return evict_for_alloc(self, EvictParams(num_tokens=tokens)).num_tokens_evicted

    freed = evict_protected_last(
        params.num_tokens, queue.protect_waiting(), evict_tokens, self.unlock
    )
    return EvictResult(num_tokens_evicted=freed)


HOOKS = {
    "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy": (
        "AFTER",
        _after_init_schedule_policy,
    ),
    "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class": (
        "AFTER",
        _after_get_prefill_adder_class,
    ),
    "sglang.srt.mem_cache.radix_cache.RadixCache.evict": ("AFTER", _after_evict),
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.evict_for_alloc": (
        "AROUND",
        _around_evict_for_alloc,
    ),
}
