"""JCT scheduler, scheduler side: SGLang's ordering replaced by scheduler/policy.py.

Settings come from PREFILLONLY_JCT_SETTINGS (scheduler/settings.py), set by the Engine or
`serve` while SGLang starts. Two hooks, both on SGLang's own extension points:

- Scheduler.init_schedule_policy (AFTER): the scheduler's SchedulePolicy becomes
  JctSchedulePolicy. Its calc_priority, which SGLang calls before every prefill batch,
  describes each waiting request as a Job (prompt tokens; tokens the radix cache holds
  now; seconds waited; its reusable-prefix marks, computed once per request), asks the
  policy for the next batch and moves that batch's requests to the head of the queue.
- Scheduler.get_prefill_adder_class (AFTER): the PrefillAdder SGLang builds for the batch
  admits only the planned requests (the first other request ends the batch), still under
  SGLang's own memory and token budgets.

Matching against the radix cache, every step: once per prefix group (its members share
the group's reusable prefix, so one match serves all of them), and for requests outside
groups MATCHES_PER_STEP at a time in rotation (the others keep their last match): the
cost of a step grows with the number of groups, not of waiting requests. SGLang matches
the requests it admits again itself (init_next_round_input), so a stale estimate only
affects the order, never what is computed.

Debugging: PREFILLONLY_SCHEDULER_LOG=<file> appends one line per step with every waiting
request (rid prefix, tokens, cached, seconds waited, predicted seconds) and the batch.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from sglang.srt.managers.schedule_policy import AddReqResult, SchedulePolicy
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from prefillonly_sgl.kv.messages import reusable_len_in
from prefillonly_sgl.scheduler.policy import JctPolicy, Job
from prefillonly_sgl.scheduler.prefix_marks import prefix_marks
from prefillonly_sgl.scheduler.settings import JctSettings

logger = logging.getLogger(__name__)

MATCHES_PER_STEP = 64  # requests outside prefix groups matched again per step
LOG_ENV = "PREFILLONLY_SCHEDULER_LOG"


@dataclass
class _Known:
    """A waiting request's Job (its marks computed once), updated every step."""

    job: Job
    entered: float  # perf_counter() when it joined the queue


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
        budgets = [scheduler.max_prefill_tokens, scheduler.chunked_prefill_size]
        self.jct = JctPolicy(
            settings.model,
            aging=settings.aging,
            token_budget=min(b for b in budgets if b and b > 0),
            long_factor=settings.long_factor,
            size_ratio=settings.size_ratio,
        )
        self.planned: set[str] | None = None  # rids the adder may admit this step
        self._known: dict[str, _Known] = {}
        self._rotation = 0
        logger.info(
            "prefillonly: JCT scheduler (aging %.3g, model %s)", settings.aging, settings.model
        )

    def calc_priority(self, waiting_queue, running_batch=None, processed_tokens=0) -> None:
        if not waiting_queue:
            self.planned = None
            return
        now = time.perf_counter()
        known = [self._describe(r, now) for r in waiting_queue]
        self._match(waiting_queue, known)
        for k in known:
            k.job.waited = now - k.entered
        plan = self.jct.plan([k.job for k in known])
        members = set(plan.batch)
        by_rid = {r.rid: r for r in waiting_queue}
        waiting_queue[:] = [by_rid[rid] for rid in plan.batch] + [
            r for r in waiting_queue if r.rid not in members
        ]
        self.planned = members
        _log_plan(known, plan)
        if len(self._known) > 2 * len(waiting_queue) + 1024:  # forget finished requests
            self._known = {r.rid: self._known[r.rid] for r in waiting_queue}

    def _describe(self, req, now: float) -> _Known:
        known = self._known.get(req.rid)
        if known is None:
            ids = req.origin_input_ids
            marks = prefix_marks(ids, reusable_len_in(req.sampling_params.custom_params))
            entered = req.time_stats.wait_queue_entry_time or now
            tokens = len(ids) + len(req.output_ids)
            known = _Known(Job(req.rid, tokens, 0, 0.0, marks), entered)
            self._known[req.rid] = known
        return known

    def _match(self, waiting_queue, known: list[_Known]) -> None:
        """Each job's cached tokens as the radix cache holds them now (see the module
        docstring for what is matched every step)."""
        by_group: dict[tuple[int, int], int] = {}
        outside: list[int] = []
        for i, k in enumerate(known):
            marks = k.job.marks
            if marks is None:
                outside.append(i)
                continue
            cached = by_group.get(marks.group)
            if cached is None:
                cached = self._cached(waiting_queue[i], marks.length)
                by_group[marks.group] = cached
            k.job.cached = cached
        if outside:
            start = self._rotation % len(outside)
            for i in (outside[start:] + outside[:start])[:MATCHES_PER_STEP]:
                known[i].job.cached = self._cached(waiting_queue[i], None)
            self._rotation = start + MATCHES_PER_STEP

    def _cached(self, req, limit: int | None) -> int:
        key = RadixKey(
            token_ids=req.origin_input_ids,
            extra_key=req.extra_key,
            limit=limit,
            cache_salt=req.cache_salt,
        )
        return self.tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len


def _log_plan(known: list[_Known], plan) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    jobs = " ".join(
        f"{k.job.key[:6]}:{k.job.tokens}/{k.job.cached}/{k.job.waited:.3f}/"
        f"{plan.predicted.get(k.job.key, 0):.3f}"
        for k in known
    )
    with open(path, "a") as f:
        f.write(f"jct waiting={jobs} batch={[key[:6] for key in plan.batch]}\n")


def _planned_adder(base):
    """`base` (SGLang's PrefillAdder class) admitting only the planned requests."""

    class PlannedPrefillAdder(base):
        plan: JctSchedulePolicy | None = None

        def add_one_req(self, req, has_chunked_req, truncation_align_size):
            planned = self.plan.planned if self.plan is not None else None
            if planned is not None and req.rid not in planned:
                return AddReqResult.OTHER  # the planned batch is complete
            return super().add_one_req(req, has_chunked_req, truncation_align_size)

    return PlannedPrefillAdder


def _after_init_schedule_policy(result, self, *args, **kwargs):
    settings = JctSettings.from_env()
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


HOOKS = {
    "sglang.srt.managers.scheduler.Scheduler.init_schedule_policy": (
        "AFTER",
        _after_init_schedule_policy,
    ),
    "sglang.srt.managers.scheduler.Scheduler.get_prefill_adder_class": (
        "AFTER",
        _after_get_prefill_adder_class,
    ),
}
