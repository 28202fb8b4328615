"""A discrete-event simulation of one engine's prefill queue under a policy (plain Python):
for unit tests, for tuning aging before a deployment, and for measuring the policy's own
cost per step without SGLang.

Requests arrive at given times; every step the policy plans a batch from what is waiting;
the batch takes `truth.batch_time(...)` seconds (a JctModel: the same as the policy's, or a
different one to see how wrong predictions hurt); when it ends, each member's reusable
prefix is cached (prefill-only KV keeps exactly that), so later requests sharing it are
cache hits. The cache never evicts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefillonly_sgl.scheduler.jct_model import JctModel
from prefillonly_sgl.scheduler.policy import Job
from prefillonly_sgl.scheduler.prefix_marks import PrefixMarks, prefix_marks


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

    def latency(self, requests: Sequence[SimRequest]) -> dict[str, float]:
        return {r.key: self.finished[r.key] - r.arrival for r in requests}


def request(key, arrival, prefix_tokens: Sequence[int], item_tokens: Sequence[int]):
    """A score request: a shared prefix (reusable) followed by its own item tokens."""
    ids = tuple(prefix_tokens) + tuple(item_tokens)
    return SimRequest(key, float(arrival), ids, len(prefix_tokens))


def simulate(policy, requests: Sequence[SimRequest], truth: JctModel | None = None) -> SimResult:
    truth = truth or policy.model
    pending = sorted(requests, key=lambda r: r.arrival)
    marks: dict[str, PrefixMarks | None] = {
        r.key: prefix_marks(r.token_ids, r.reusable_len) for r in requests
    }
    cached_levels: set[tuple[int, int]] = set()
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
            Job(r.key, len(r.token_ids), _cached(marks[r.key], cached_levels), now - r.arrival,
                marks[r.key])
            for r in waiting
        ]  # fmt: skip
        started = time.perf_counter()
        plan = policy.plan(jobs)
        plan_seconds.append(time.perf_counter() - started)
        if not plan.batch:  # everything waits for a prefix in flight: never in a simulation
            raise RuntimeError("the policy planned an empty batch with nothing in flight")
        by_key = {job.key: job for job in jobs}
        members = [by_key[k] for k in plan.batch]
        now += truth.batch_time((j.tokens - j.cached, j.tokens) for j in members)
        computed += sum(j.tokens - j.cached for j in members)
        for job in members:
            finished[job.key] = now
            order.append(job.key)
            if job.marks is not None:
                cached_levels.update(job.marks.levels)
        batches.append([j.key for j in members])
        done = set(plan.batch)
        waiting = [r for r in waiting if r.key not in done]
    return SimResult(finished, order, batches, computed, plan_seconds)


def _cached(marks: PrefixMarks | None, cached_levels: set[tuple[int, int]]) -> int:
    if marks is None:
        return 0
    return max((n for n, h in marks.levels if (n, h) in cached_levels), default=0)
