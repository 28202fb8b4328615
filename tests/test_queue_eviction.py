"""Queue-aware eviction as plain Python (features/jct_scheduler/eviction.py, no SGLang): the order
prefixes are given up in, the release of every protection, when a batch waits for cache
hits, what the JCT policy tells it, and a simulated overloaded recommendation queue where
it keeps more of the prompt tokens cached than SGLang's least-recently-used order."""

from __future__ import annotations

import random

import pytest

from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.features.jct_scheduler.eviction import (
    DEFER_LIMIT,
    EVICTION_POLICIES,
    defer_for_hits,
    evict_protected_last,
    release_order,
)
from prefillonly_sgl.features.jct_scheduler.jct_model import DEFAULT, JctModel
from prefillonly_sgl.features.jct_scheduler.policy import JctPolicy, Job
from prefillonly_sgl.features.jct_scheduler.prefix_marks import prefix_marks
from prefillonly_sgl.features.jct_scheduler.settings import JctSettings
from prefillonly_sgl.features.jct_scheduler.simulate import request, simulate


class LruCache:
    """A radix cache's eviction in miniature: prefixes with a last use and a lock count;
    evict takes unlocked ones, least recently used first."""

    def __init__(self, prefixes: dict[str, tuple[int, float]]) -> None:
        self.tokens = {name: tokens for name, (tokens, _) in prefixes.items()}
        self.used = {name: used for name, (_, used) in prefixes.items()}
        self.locks = dict.fromkeys(prefixes, 0)
        self.evicted: list[str] = []

    def lock(self, name: str) -> str:
        self.locks[name] += 1
        return name

    def unlock(self, name: str) -> None:
        self.locks[name] -= 1

    def evict(self, need: int) -> int:
        freed = 0
        for name in sorted(self.tokens, key=self.used.get):
            if freed >= need:
                break
            if self.locks[name] == 0:
                freed += self.tokens.pop(name)
                self.evicted.append(name)
        return freed


def test_release_order_gives_up_the_furthest_next_use_first():
    assert release_order({"a": 0.5, "b": -2.0, "c": 7.0}) == ["c", "a", "b"]
    assert release_order({}) == []


def test_what_no_waiting_request_hits_goes_first_then_the_waited_for_in_release_order():
    # LRU alone would evict "waited_old" first: it is the least recently used.
    cache = LruCache({"waited_old": (100, 1.0), "waited_soon": (100, 2.0), "idle": (100, 3.0),
                      "idle2": (50, 4.0)})  # fmt: skip
    protected = [cache.lock("waited_old"), cache.lock("waited_soon")]  # release order
    freed = evict_protected_last(120, protected, cache.evict, cache.unlock)
    assert freed == 150 and cache.evicted == ["idle", "idle2"]
    assert cache.locks == {"waited_old": 0, "waited_soon": 0, "idle": 0, "idle2": 0}
    # more than the unprotected hold: protection is given up one prefix at a time
    protected = [cache.lock("waited_old"), cache.lock("waited_soon")]
    assert evict_protected_last(80, protected, cache.evict, cache.unlock) == 100
    assert cache.evicted[-1] == "waited_old" and "waited_soon" in cache.tokens
    assert cache.locks["waited_soon"] == 0  # released though never needed


def test_every_protection_is_released_when_evict_fails():
    cache = LruCache({"a": (10, 1.0), "b": (10, 2.0)})
    protected = [cache.lock("a"), cache.lock("b")]

    def broken(need):
        raise RuntimeError("evict failed")

    with pytest.raises(RuntimeError, match="evict failed"):
        evict_protected_last(5, protected, broken, cache.unlock)
    assert cache.locks == {"a": 0, "b": 0}


def test_a_batch_waits_for_hits_only_when_it_would_evict_their_prefix():
    assert defer_for_hits(need=1000, room=500, waited=0.1, predicted=1.0, hits=3)
    assert not defer_for_hits(need=400, room=500, waited=0.1, predicted=1.0, hits=3)  # fits
    assert not defer_for_hits(need=1000, room=500, waited=0.1, predicted=1.0, hits=0)
    # a request deferred so long that hits which keep arriving would starve it
    assert not defer_for_hits(1000, 500, waited=DEFER_LIMIT * 1.0, predicted=1.0, hits=3)


def test_the_policy_reports_next_use_new_prefix_tokens_and_plans_hits_only():
    model = JctModel(per_batch=0.1, per_token=0.001, per_token_cached=0.0)
    policy = JctPolicy(model, aging=1.0, token_budget=8192)
    cached, cold = tuple(range(1, 1001)), tuple(range(5001, 6001))

    def job(key, profile, cached_tokens, waited=0.0):
        ids = profile + tuple(range(90_000 + 100 * int(key[-1]), 90_000 + 100 * int(key[-1]) + 20))
        return Job(key, len(ids), cached_tokens, waited, prefix_marks(ids, len(profile)))

    # the cold user's leader has waited long enough for aging to put it first
    jobs = [job("hit1", cached, 1000), job("hit2", cached, 1000), job("cold1", cold, 0, 5.0),
            job("cold2", cold, 0, 5.0)]  # fmt: skip
    plan = policy.plan(jobs)  # cold2 rides behind its leader (prefill_kv/packing.py)
    assert plan.batch == ["cold1", "cold2"] and plan.new_prefix_tokens == 1000 and plan.hits == 2
    assert plan.new_tokens == 1040 and plan.head_waited == pytest.approx(5.0)
    # the aged cold group runs next, so the cached group's next use is the later one: its
    # prefix would be given up first (if nothing unprotected were left)
    order = [policy.group_marks(g).group for g in release_order(policy.group_next_use())]
    assert order == [jobs[0].marks.group, jobs[2].marks.group]
    hits = policy.plan(jobs, hits_only=True)
    assert hits.batch == ["hit1", "hit2"] and hits.new_prefix_tokens == 0


def _overloaded_recommendation(users: int, items: int, seed: int):
    """Users' 1,000-token profiles, each scored against `items` 15-token items, arriving
    interleaved at 4 requests/s: more than a 1,000-token cache hit costs, so a queue forms."""
    rng = random.Random(seed)
    keys = [(u, k) for u in range(users) for k in range(items)]
    rng.shuffle(keys)
    requests, t = [], 0.0
    for u, k in keys:
        t += rng.expovariate(4.0)
        item = 10_000_000 + 100_000 * u + 100 * k
        requests.append(request(f"u{u}-{k}", t, range(100_000 * u, 100_000 * u + 1000),
                                range(item, item + 15)))  # fmt: skip
    return requests


def test_simulated_queue_aware_eviction_keeps_more_prompt_tokens_cached_than_lru():
    """Sixteen users, a cache of two profiles (the paper's L4 case: a few profiles fit).
    The eviction order on its own (followers waiting a forward for their leader's prefix,
    as without packing): >= 10% fewer tokens recomputed than LRU. With followers packed
    behind their leaders, a group needs its prefix cached for less long, so packing saves
    more than the eviction order does; queue-aware eviction still recomputes no more."""
    computed = {}
    for packed in (False, True):
        lru, queue = 0, 0
        for seed in range(4):
            requests = _overloaded_recommendation(16, 10, seed)
            by = {
                policy: simulate(
                    JctPolicy(DEFAULT, pack_followers=packed),
                    requests,
                    capacity=2100,
                    eviction=policy,
                    packed=packed,
                )
                for policy in EVICTION_POLICIES
            }
            assert by["queue"].computed_tokens <= by["lru"].computed_tokens, (packed, seed)
            assert by["lru"].evicted_tokens > 0  # the cache was under pressure
            lru += by["lru"].computed_tokens
            queue += by["queue"].computed_tokens
        computed[packed] = lru, queue
    lru, queue = computed[False]
    assert queue < 0.9 * lru
    assert max(computed[True]) < min(computed[False])


def test_eviction_is_a_checked_jct_option():
    (option,) = [o for o in FEATURES["jct_scheduler"].options if o.engine_arg == "jct_eviction"]
    assert option.choices == EVICTION_POLICIES and option.flag == "--jct-eviction"
    assert JctSettings().eviction == "queue"
    with pytest.raises(ValueError, match="JCT eviction must be one of queue, lru"):
        JctSettings(eviction="mru")
    assert JctSettings.from_dict(JctSettings(eviction="lru").to_dict()).eviction == "lru"
    with pytest.raises(ValueError, match="eviction must be one of"):
        simulate(JctPolicy(DEFAULT), [], eviction="fifo")
