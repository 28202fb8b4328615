"""Per-step cost of the JCT scheduler at 100 / 1,000 / 10,000 waiting requests (issue 11).

What SGLang's scheduler pays before each prefill batch: JctSchedulePolicy.calc_priority on a
real SGLang RadixCache (simulated: no KV pool) holding some users' profiles, with waiting
requests shaped like recommendation traffic (users x items behind ~1.5k-token profiles),
and the same count of requests that share nothing (every one its own group: the worst
case for matching, which rotates through MATCHES_PER_STEP of them per step). Reported: the
first step (which also hashes every new request's prefix once) and the steady state
(median and p90 of the following steps), and the plain policy's share (plan()).

    .venv/bin/python benchmarks/jct_scheduler_overhead.py [--sizes 100 1000 10000] [--steps 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from array import array
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from prefillonly_sgl.features.jct_scheduler.jct_model import DEFAULT
from prefillonly_sgl.features.jct_scheduler.scheduler_process import JctSchedulePolicy
from prefillonly_sgl.features.jct_scheduler.settings import JctSettings
from prefillonly_sgl.features.prefill_kv.messages import with_reusable_len

PROFILE_TOKENS = 1500
ITEM_TOKENS = 100
ITEMS_PER_USER = 10


def _request(rid: str, ids: list[int], reusable: int, entered: float):
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=array("q", ids),  # as SGLang holds them
        output_ids=[],
        sampling_params=SimpleNamespace(custom_params=with_reusable_len(None, reusable)),
        time_stats=SimpleNamespace(wait_queue_entry_time=entered),
        extra_key=None,
        cache_salt=None,
    )


def workload(n: int, grouped: bool, rng: random.Random):
    """n waiting requests and a radix cache holding a third of the users' profiles."""
    cache = RadixCache.create_simulated()
    now = time.perf_counter()
    queue = []
    users = max(1, n // ITEMS_PER_USER) if grouped else n
    profiles = [[rng.randrange(1000, 40000) for _ in range(PROFILE_TOKENS)] for _ in range(users)]
    for u in range(0, users, 3):
        key = RadixKey(token_ids=array("q", profiles[u]))
        cache.insert(InsertParams(key=key, value=torch.arange(PROFILE_TOKENS, dtype=torch.int64)))
    for i in range(n):
        profile = profiles[i % users]
        item = [rng.randrange(1000, 40000) for _ in range(ITEM_TOKENS)]
        queue.append(_request(f"r{i}", profile + item, PROFILE_TOKENS, now - rng.random()))
    return cache, queue


def measure(n: int, grouped: bool, steps: int) -> dict:
    cache, queue = workload(n, grouped, random.Random(n))
    scheduler = SimpleNamespace(
        tree_cache=cache,
        enable_hierarchical_cache=False,
        enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
        max_prefill_tokens=16384,
        chunked_prefill_size=4096,
    )
    policy = JctSchedulePolicy(scheduler, JctSettings(model=DEFAULT))
    plan_seconds = []
    inner = policy.jct.plan_step

    def timed_plan(now, explain=False):
        started = time.perf_counter()
        result = inner(now, explain)
        plan_seconds.append(time.perf_counter() - started)
        return result

    policy.jct.plan_step = timed_plan
    step_seconds = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        policy.calc_priority(queue)
        step_seconds.append(time.perf_counter() - started)
    steady = step_seconds[1:]
    shape = f"{n // ITEMS_PER_USER} users x {ITEMS_PER_USER} items" if grouped else "no sharing"
    return {
        "waiting": n,
        "shape": shape,
        "first_ms": step_seconds[0] * 1e3,
        "median_ms": statistics.median(steady) * 1e3,
        "p90_ms": sorted(steady)[int(0.9 * (len(steady) - 1))] * 1e3,
        "plan_ms": statistics.median(plan_seconds[1:]) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'waiting':>8} {'shape':<22} {'first step':>11} {'steady median':>14} "
          f"{'p90':>8} {'of it, plan()':>14}")  # fmt: skip
    for n in args.sizes:
        for grouped in (True, False):
            r = measure(n, grouped, args.steps)
            print(
                f"{r['waiting']:>8} {r['shape']:<22} {r['first_ms']:>9.2f}ms "
                f"{r['median_ms']:>12.3f}ms {r['p90_ms']:>6.3f}ms {r['plan_ms']:>12.3f}ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
