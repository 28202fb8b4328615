"""The JCT policy on synthetic requests (plain Python, no SGLang): order, aging, cache hits,
prefix groups, batch formation, starvation bounds, and the job-time model's fit."""

from __future__ import annotations

import pytest

from prefillonly_sgl.features.jct_scheduler import jct_model
from prefillonly_sgl.features.jct_scheduler.jct_model import JctModel, Sample
from prefillonly_sgl.features.jct_scheduler.policy import JctPolicy, Job
from prefillonly_sgl.features.jct_scheduler.prefix_marks import prefix_marks
from prefillonly_sgl.features.jct_scheduler.simulate import request, simulate

# 0.1 s per batch + 1 ms per new token: easy to reason about.
MODEL = JctModel(per_batch=0.1, per_token=0.001, per_token_cached=0.0)


def tokens(start: int, n: int) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def job(key, n, cached=0, waited=0.0, prefix=None, reusable=0):
    ids = (prefix or ()) + tokens(10_000 + hash(key) % 1000 * 10_000, n - len(prefix or ()))
    return Job(key, n, cached, waited, prefix_marks(ids, reusable or len(prefix or ())))


def policy(**kwargs) -> JctPolicy:
    return JctPolicy(MODEL, **{"aging": 1.0, "token_budget": 4096, **kwargs})


def test_shortest_predicted_job_first():
    plan = policy(size_ratio=1.0).plan([job("a", 3000), job("b", 200), job("c", 900)])
    assert plan.batch == ["b"]
    assert plan.predicted["a"] == pytest.approx(0.1 + 3.0)


def test_aging_lets_a_long_waiting_job_overtake():
    # a: 3.1 s, waited 2.5 s -> 0.6; b: 0.3 s fresh -> 0.3: b first
    assert policy(size_ratio=1).plan([job("a", 3000, waited=2.5), job("b", 200)]).batch == ["b"]
    # waited 2.9 s -> 0.2 < 0.3: a first, and alone (it is long)
    assert policy().plan([job("a", 3000, waited=2.9), job("b", 200)]).batch == ["a"]


def test_a_cache_hit_jumps_the_queue():
    # a has 3000 tokens but 2900 are cached: 0.2 s; b is 400 fresh tokens: 0.5 s
    plan = policy(size_ratio=1).plan([job("b", 400), job("a", 3000, cached=2900)])
    assert plan.batch == ["a"]


def test_short_requests_are_packed_and_a_long_one_runs_alone():
    jobs = [job(f"s{i}", 100 + i) for i in range(5)] + [job("long", 2000)]
    assert policy().plan(jobs).batch == ["s0", "s1", "s2", "s3", "s4"]
    assert policy(token_budget=250).plan(jobs).batch == ["s0", "s1"]  # the token budget
    alone = policy().plan([job("long", 2000, waited=100.0)] + jobs[:5])
    assert alone.batch == ["long"]  # aged to the head: a long job takes no one along


def test_a_prefix_group_pays_for_its_prefix_once():
    profile = tokens(1, 1500)
    jobs = [job(f"item{i}", 1600 + i, prefix=profile) for i in range(5)]
    plan = policy(pack_followers=False).plan(jobs)
    assert plan.batch == ["item0"]  # never two members sharing an uncached prefix
    # the leader runs cold (0.1 + 1.6 s); the followers are predicted as the cache hits
    # they become after it: the leader's time, then their own 0.1 + 0.1 s
    assert plan.predicted["item0"] == pytest.approx(1.7)
    assert plan.predicted["item1"] == pytest.approx(1.7 + 0.2 + 0.001)
    hits = [job(f"item{i}", 1600 + i, cached=1500, prefix=profile) for i in range(1, 5)]
    assert policy().plan(hits).batch == ["item1", "item2", "item3", "item4"]


def test_followers_ride_in_their_leaders_batch():
    """Packed (prefill_kv/packing.py): the leader computes the prefix and its followers
    read it in the same forward, cheapest first, counting only their own tokens; a long
    leader takes them along within a token budget of their own."""
    profile = tokens(1, 1500)
    jobs = [job(f"item{i}", 1600 + i * 50, prefix=profile) for i in range(5)]
    plan = policy().plan(jobs)  # the leader is long (1.7 s > 8 x 0.1 s): riders only
    assert plan.batch == ["item0", "item1", "item2", "item3", "item4"]
    assert plan.new_tokens == 1600 + 150 + 200 + 250 + 300  # the profile counted once
    assert policy(token_budget=400).plan(jobs).batch == ["item0", "item1", "item2"]
    short = tokens(1, 150)
    group = [job(f"g{i}", 200 + i, prefix=short) for i in range(3)]
    alone = job("alone", 210)
    plan = policy(long_factor=100).plan([*group, alone])
    assert plan.batch == ["g0", "g1", "g2", "alone"]  # a leader's riders right behind it


def test_a_group_joins_a_batch_whole_or_waits_whole():
    """SGLang #9748's shape: each request a cold query and its items. A second group that
    would fit only in part waits for the next batch whole (split, its remaining items
    would finish a forward later, and the request with them); a smaller request behind
    it fills the room instead."""
    first = [job(f"a{i}", 300, prefix=tokens(1, 120), waited=1.0) for i in range(4)]
    second = [job(f"b{i}", 300, prefix=tokens(50_000, 120)) for i in range(4)]
    small = job("small", 250)
    # budget 1200: group a costs 300 + 3 x 180 = 840; group b the same, 360 left
    plan = policy(token_budget=1200, long_factor=100).plan([*first, *second, small])
    assert sorted(plan.batch) == ["a0", "a1", "a2", "a3", "small"]
    plan = policy(token_budget=1700, long_factor=100).plan([*first, *second])
    assert len(plan.batch) == 8  # both fit whole


def test_requests_sharing_only_an_uncached_instruction_are_not_batched_together():
    instruction = tokens(1, 256)
    alice = job("alice", 700, prefix=instruction + tokens(5000, 300))
    bob = job("bob", 700, prefix=instruction + tokens(9000, 300))
    other = job("other", 700, prefix=tokens(20_000, 556))
    plan = policy(long_factor=100).plan([alice, bob, other])
    assert len(plan.batch) == 2 and "other" in plan.batch  # alice or bob, not both
    cached = [Job(j.key, j.tokens, 256, 0.0, j.marks) for j in (alice, bob)]
    assert policy(long_factor=100).plan(cached).batch == ["alice", "bob"]


def test_a_prefix_in_flight_is_not_computed_again_by_the_next_batch():
    """With overlapped scheduling the next batch is planned before the last one's
    prefixes reach the cache: their groups wait one step."""
    p = policy(pack_followers=False)
    profile = tokens(1, 1500)
    jobs = [job(f"item{i}", 1600 + i, prefix=profile) for i in range(3)]
    assert p.plan(jobs).batch == ["item0"]
    rest = jobs[1:] + [job("other", 300)]
    assert p.plan(rest).batch == ["other"]  # item1/2 would recompute the profile
    cached = [Job(j.key, j.tokens, 1500, 0.0, j.marks) for j in jobs[1:]]
    assert p.plan(cached).batch == ["item1", "item2"]
    # packed: the group rides with its leader; a member arriving while it is in flight
    # waits for the cache as well
    p = policy()
    assert p.plan(jobs).batch == ["item0", "item1", "item2"]
    late = job("item3", 1603, prefix=profile)
    assert p.plan([late, job("other", 300)]).batch == ["other"]


def test_simulated_burst_runs_each_users_profile_once_in_the_ideal_order():
    """20 users x 10 items behind ~1.5k-token profiles, all sent at once, shuffled."""
    import random

    rng = random.Random(0)
    reqs = [
        request(f"u{u}i{i}", 0.0, profile, tokens(u * 10**5 + 5 * 10**4 + i * 200, 100))
        for u in range(20)
        for profile in [tokens(u * 10**5, 1500)]
        for i in range(10)
    ]
    rng.shuffle(reqs)
    result = simulate(policy(), reqs)
    assert result.computed_tokens == 20 * 1500 + 200 * 100  # each profile computed once
    for batch in result.batches:  # each batch: one user's items, or one cold request
        assert len({key.split("i")[0] for key in batch}) == 1
    fcfs = simulate(FirstComeFirstServed(), reqs, packed=False)  # stock SGLang
    assert fcfs.computed_tokens > result.computed_tokens  # some profiles computed again
    mean = sum(result.latency(reqs).values()) / len(reqs)
    mean_fcfs = sum(fcfs.latency(reqs).values()) / len(reqs)
    print(f"mean latency: jct {mean:.2f} s, fcfs {mean_fcfs:.2f} s")
    assert mean < 0.7 * mean_fcfs


class FirstComeFirstServed:
    """SGLang's default, for comparison: arrival order, packed under the token budget,
    blind to what requests share."""

    model = MODEL

    def plan(self, jobs):
        from prefillonly_sgl.features.jct_scheduler.policy import Plan

        batch, budget = [], 4096
        for j in sorted(jobs, key=lambda j: -j.waited):
            if j.tokens - j.cached > budget and batch:
                break
            batch.append(j.key)
            budget -= j.tokens - j.cached
        return Plan(batch=batch)


def test_very_large_aging_is_first_come_first_served():
    reqs = [request(f"r{i}", 0.01 * i, (), tokens(i * 10_000, 2000 - 150 * i)) for i in range(10)]
    result = simulate(policy(aging=1e9, token_budget=100), reqs)
    assert result.order == [f"r{i}" for i in range(10)]


def _starvation_run(aging: float):
    long = request("long", 1.0, (), tokens(0, 3000))  # 3.1 s
    # one short (0.2 s) every 0.2 s, each arriving just before the one ahead is done
    shorts = [
        request(f"s{i}", 0.2 * i - 1e-6, (), tokens(10_000 + 100 * i, 100)) for i in range(200)
    ]
    result = simulate(policy(aging=aging, long_factor=5), [long, *shorts])  # shorts: 0.2 s
    return result.latency([long])["long"]


def test_aging_bounds_how_long_a_long_job_waits_behind_a_stream_of_short_ones():
    """Shorts (0.2 s) arrive every 0.2 s, the engine is busy all the time: without aging
    the long job (3.1 s) waits for the whole stream; with aging its wait is bounded by
    about (its time - a short's) / aging, plus the batch running when it wins."""
    assert _starvation_run(aging=0.0) > 35  # after the last short (~40 s)
    for aging in (0.5, 1.0, 2.0):
        bound = (3.1 - 0.2) / aging + 0.2 + 3.1  # wait + the batch in progress + its own run
        assert _starvation_run(aging) <= bound + 1e-9  # tight: the bound is reached


def test_fit_recovers_the_model_and_reports_its_quality():
    truth = JctModel(per_batch=0.05, per_token=4e-4, per_token_cached=2e-8, per_token_squared=1e-8)
    samples = [
        Sample(((new, cached + new),) * batch, truth.batch_time([(new, cached + new)] * batch))
        for new in (64, 256, 1024, 4096)
        for cached in (0, 1024, 8192)
        for batch in (1, 4)
    ]
    model, report = jct_model.fit(samples)
    assert model.per_batch == pytest.approx(0.05, rel=1e-6)
    assert model.per_token_cached == pytest.approx(2e-8, rel=1e-6)
    assert report.r2 == pytest.approx(1.0) and report.relative_error_max < 1e-9
    assert "R^2 1.0000" in report.summary()
    # noisy timings: the fit never goes negative, so more tokens never predict less time
    noisy = [Sample(s.requests, s.seconds * (1.3 if i % 3 else 0.7)) for i, s in enumerate(samples)]
    rough, _ = jct_model.fit(noisy)
    assert min(rough.coefficients().values()) >= 0
    assert rough.job_time(4000, 4000) > rough.job_time(9, 9)
    with pytest.raises(ValueError, match="at least 4"):
        jct_model.fit(samples[:3])


def test_policy_arguments_are_checked():
    with pytest.raises(ValueError, match="aging must be >= 0"):
        JctPolicy(MODEL, aging=-1)


def test_the_waiting_set_is_kept_between_steps():
    """What the SGLang side uses: add / discard / set_group_cached / plan_step."""
    p = policy()
    shared, other = tokens(1, 1500), tokens(90_000, 1500)
    for i in range(3):
        p.add(f"a{i}", 1600, 0.0, prefix_marks(shared + tokens(5000 + 100 * i, 100), 1500))
    p.add("b", 1600, 0.0, prefix_marks(other + tokens(7000, 100), 1500))
    p.add("solo", 120, 0.0, None)
    assert len(p) == 5 and set(p.keys()) == {"a0", "a1", "a2", "b", "solo"}
    ga, gb = p.group_of("a0"), p.group_of("b")
    assert ga == p.group_of("a2") != gb and p.group_of("solo") == -1
    assert sorted(p.live_groups()) == sorted([ga, gb])
    assert p.groups_sharing(["a1"]) == {ga}
    assert p.plan_step(0.0).batch == ["solo"]  # 120 tokens: the shortest
    p.discard("solo")
    p.set_group_cached(ga, 1500)  # the cache now holds a's profile: its items are hits
    assert p.plan_step(2.0).batch == ["a0", "a1", "a2"]
    for key in ("a0", "a1", "a2"):
        p.discard(key)
    assert p.live_groups() == [gb]
    p.add("c", 1600, 3.0, prefix_marks(tokens(50_000, 1600), 1500))
    assert p.group_of("c") == ga  # the freed group id, reused for another prefix
    assert p.plan_step(3.0, explain=True).predicted["c"] == pytest.approx(0.1 + 1.6)


def test_profile_key_ignores_features_that_leave_job_time_as_it_is(tmp_path):
    from prefillonly_sgl.features.jct_scheduler.profiles import profile_key

    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    base = profile_key(tmp_path, "cpu", "auto", ["prefill_attention", "prefill_kv"])
    same = ["hybrid_prefill", "prefill_kv", "jct_scheduler", "prefill_attention", "prompt_logprobs"]
    assert profile_key(tmp_path, "cpu", "auto", same) == base
    assert base["dtype"] == "bfloat16" and base["features"] == ["prefill_attention", "prefill_kv"]
    assert profile_key(tmp_path, "cpu", "auto", ["prefill_attention"]) != base


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_built_in_models_pack_cache_hits_and_run_a_cold_profile_alone(dtype):
    """With each dtype's built-in model, short items behind a cached 1k-token profile are
    one batch (measured: 8 of them together cost 0.5x eight alone), and an uncached
    1k-token profile runs alone. (The float32 model used for every dtype before predicted
    bfloat16 hits as long jobs, so they ran one by one.)"""
    model = jct_model.default_model(dtype)
    profile = tokens(1, 1000)
    hits = [job(f"hit{i}", 1030 + i, cached=1000, prefix=profile) for i in range(8)]
    cold = job("cold", 1030, prefix=tokens(50_000, 1000))
    plan = JctPolicy(model, aging=1.0, token_budget=16384).plan(hits + [cold])
    assert sorted(plan.batch) == sorted(h.key for h in hits)
    plan = JctPolicy(model, aging=1.0, token_budget=16384).plan([cold, job("x", 1030)])
    assert len(plan.batch) == 1


def test_resolve_settings_takes_the_engines_dtype_model(tmp_path, monkeypatch):
    from prefillonly_sgl.features.jct_scheduler.settings import resolve_settings

    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path / "cache"))  # no saved profiles
    (tmp_path / "config.json").write_text('{"torch_dtype": "float32"}')
    for dtype, expected in (("auto", "float32"), ("bfloat16", "bfloat16")):
        settings = resolve_settings(tmp_path, "cpu", dtype, ["prefill_attention"])
        assert settings.model == jct_model.DEFAULTS[expected]


def test_hybrid_models_scale_the_default_models_attention_terms(tmp_path):
    """Qwen3.5's linear-attention layers cost the same per new token whatever is cached:
    only the attention layers' share (1 in 4) of the built-in attention terms remains."""
    import json

    from prefillonly_sgl.features.jct_scheduler.jct_model import DEFAULT
    from prefillonly_sgl.features.jct_scheduler.settings import resolve_settings
    from prefillonly_sgl.models.families import attention_layer_share

    hybrid = tmp_path / "hybrid"
    hybrid.mkdir()
    layer_types = ["linear_attention"] * 3 + ["full_attention"]
    (hybrid / "config.json").write_text(json.dumps({"text_config": {"layer_types": layer_types}}))
    assert attention_layer_share(hybrid) == 0.25
    assert attention_layer_share(tmp_path / "missing") == 1.0
    model = resolve_settings(hybrid, "cpu", "float32", ()).model
    assert model.per_token == DEFAULT.per_token
    assert model.per_token_cached == DEFAULT.per_token_cached * 0.25
    assert model.per_token_squared == DEFAULT.per_token_squared * 0.25
    # a cache hit saves less on a hybrid: the prefix's attention is most of what it skips
    assert model.job_time(100, 1100) < DEFAULT.job_time(100, 1100)


LLAMA_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
)


def test_a_card_without_a_profile_gets_its_shapes_model_and_batches_cold_groups(
    tmp_path, monkeypatch
):
    """On CUDA the built-in model is the model's shape over the card's rates
    (device_model.py): Llama-3.2-1B's decoder matmuls (973M weights) at half the H200's
    792 TFLOP/s, a forward's fixed cost from its 16 layers. Under it cold recommendation
    groups (a 1-2k-token profile and its items each) batch together up to the token
    budget, as stock SGLang fills its batches; under the CPU's bfloat16 model (what a card
    ran before, issue 73) each cold leader was long and ran alone with its riders."""
    import json

    from prefillonly_sgl.features.jct_scheduler import settings as jct_settings
    from prefillonly_sgl.features.jct_scheduler.device_model import card_model, decoder_shape

    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path / "cache"))  # no saved profiles
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_1B))
    shape = decoder_shape(tmp_path)
    assert shape.linear_weights == 16 * (2048 * 64 * (2 * 32 + 2 * 8) + 3 * 2048 * 8192)
    model = card_model(shape, "NVIDIA H200")
    assert model.per_token == pytest.approx(2 * shape.linear_weights / 396e12)
    assert model.per_batch == pytest.approx(3e-3 + 16 * 1e-4)
    assert "H200" in model.source
    monkeypatch.setattr(jct_settings, "cuda_device_name", lambda: "NVIDIA H200")
    resolved = jct_settings.resolve_settings(tmp_path, "cuda", "bfloat16", ["prefill_kv"]).model
    assert resolved == model
    cpu = jct_settings.resolve_settings(tmp_path, "cpu", "bfloat16", ["prefill_kv"]).model
    assert cpu == jct_model.DEFAULTS["bfloat16"]

    def groups():
        jobs = []
        for user in range(4):
            profile = tokens(100_000 * (user + 1), 1500)
            jobs += [job(f"u{user}i{i}", 1650, prefix=profile) for i in range(8)]
        return jobs

    on_card = JctPolicy(model, aging=1.0, token_budget=8192).plan(groups())
    leaders = {key.split("i")[0] for key in on_card.batch}
    assert len(leaders) >= 2 and on_card.new_tokens <= 8192
    on_cpu_model = JctPolicy(cpu, aging=1.0, token_budget=8192).plan(groups())
    assert len({key.split("i")[0] for key in on_cpu_model.batch}) == 1


def test_an_unknown_card_and_an_unreadable_shape_fall_back(tmp_path):
    from prefillonly_sgl.features.jct_scheduler.device_model import (
        OTHER_CARD,
        card_rates,
        decoder_shape,
    )

    assert card_rates("NVIDIA H100 80GB HBM3").name == "H100"
    assert card_rates("Some Future GPU") is OTHER_CARD
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    assert decoder_shape(tmp_path) is None
    assert decoder_shape(tmp_path / "missing") is None
