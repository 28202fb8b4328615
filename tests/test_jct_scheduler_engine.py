"""The JCT scheduler on the real engine (tiny Llama, CPU, float32): `prefillonly profile`
writes a profile that engines of the same model, device, dtype and features find; a short
request sent after long ones finishes before them; with a huge aging the order is first
come, first served; concurrent calls sharing prefixes still equal a transformers forward
(1e-4).

The tiny model runs a 3.6k-token prompt in ~50 ms, less than the time requests wait for
one another here, so its own profile would make aging decide every order; the ordering
tests give the engines a profile with the default model's CPU costs instead (seconds per
prompt, as on a real deployment)."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine
from prefillonly_sgl.cli import main
from prefillonly_sgl.features import choose_features
from prefillonly_sgl.features.jct_scheduler.jct_model import DEFAULT, FitReport
from prefillonly_sgl.features.jct_scheduler.profiles import save_profile
from prefillonly_sgl.features.jct_scheduler.settings import resolve_settings

pytestmark = pytest.mark.slow  # engines per scheduling policy

TOLERANCE = 1e-4
POOL = 8192


@pytest.fixture(scope="module")
def saved_profile(tiny_llama_path, tmp_path_factory):
    """`prefillonly profile` on the tiny model, saved in a private cache folder."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFILLONLY_CACHE", str(cache))
        argv = ["profile", "--model", str(tiny_llama_path), "--device", "cpu"]
        assert main([*argv, "--dtype", "float32", "--max-tokens", "512", "--repeats", "1"]) == 0
        (path,) = (cache / "jct-profiles").glob("*.json")
        found = resolve_settings(
            tiny_llama_path, "cpu", "float32", choose_features(None, {"prefill_only_kv": True})
        )
    return path, found


@pytest.fixture(scope="module")
def cpu_costs(tmp_path_factory):
    """A profile file with the default model's CPU costs."""
    path = tmp_path_factory.mktemp("profile") / "cpu.json"
    save_profile({"model": "default"}, DEFAULT, FitReport(0, 1.0, 0.0, 0.0, 0.0), [], path)
    return path


def _engine(path, **kwargs):
    return Engine(path, device="cpu", dtype="float32", max_total_tokens=POOL, **kwargs)


@pytest.fixture(scope="module")
def engine(tiny_llama_path, cpu_costs):
    with _engine(tiny_llama_path, jct_profile=cpu_costs) as engine:
        yield engine


def test_profile_is_saved_fitted_and_found_for_the_same_engine_settings(saved_profile):
    path, found = saved_profile
    document = json.loads(path.read_text())
    assert document["key"]["dtype"] == "float32" and document["key"]["device"] == "cpu"
    assert document["key"]["features"] == ["prefill_attention", "prefill_kv"]
    assert set(document["model"]) == {
        "per_batch",
        "per_token",
        "per_token_cached",
        "per_token_squared",
    }
    assert len(document["samples"]) >= 10 and min(document["model"].values()) >= 0
    assert found.model.source == str(path)  # what Engine / serve start with


def test_the_engine_runs_the_jct_policy_with_the_given_profile(engine, cpu_costs):
    assert "jct_scheduler" in engine.features
    assert engine.jct_settings.model.source == str(cpu_costs)
    assert engine.jct_settings.aging == 1.0


def _completion_order(engine, labels, calls) -> list[str]:
    """Sends every (name, query, items) at once; the names in the order they finish."""
    done = []

    async def one(name, query, items):
        await engine.async_score(query, items, labels)
        done.append(name)

    async def everything():
        await asyncio.gather(*(one(*call) for call in calls))

    engine.score("warm", ["up"], labels)  # SGLang answers on the loop of the first call
    engine._sgl.loop.run_until_complete(everything())
    return done


def _long_then_short():
    """Four 3.6k-token prompts, then a 9-token one. Token ids: nothing to tokenize, so all
    five reach the scheduler within milliseconds, while the first long one runs."""
    longs = [(f"long{i}", [10 + i] * 3600, [[7]]) for i in range(4)]
    return longs + [("short", [11] * 8, [[7]])]


def test_a_short_request_sent_after_long_ones_finishes_before_them(engine, labels):
    order = _completion_order(engine, labels, _long_then_short())
    # at most the first long one was already running when the short one arrived
    assert order.index("short") <= 1, order


def test_with_a_huge_aging_the_order_is_first_come_first_served(tiny_llama_path, labels, cpu_costs):
    with _engine(tiny_llama_path, jct_aging=1e9, jct_profile=cpu_costs) as fcfs:
        assert fcfs.jct_settings.aging == 1e9
        order = _completion_order(fcfs, labels, _long_then_short())
    assert order == ["long0", "long1", "long2", "long3", "short"]


def test_concurrent_calls_sharing_prefixes_match_transformers(engine, reference, labels):
    profiles = [f"User {u} profile: likes walks, books and films number {u}.\n" * 6 for u in (1, 2)]
    items = [f"Item {i}: a film. Relevant?" for i in range(5)]
    calls = [(f"{u}-{i}", profiles[u], [item]) for u in (0, 1) for i, item in enumerate(items)]
    results = {}

    async def one(name, query, its):
        results[name] = (await engine.async_score(query, its, labels)).scores

    async def everything():
        await asyncio.gather(*(one(*call) for call in calls))

    engine._sgl.loop.run_until_complete(everything())
    for name, query, its in calls:
        assert max_abs_diff(results[name], reference.score(query, its, labels)) < TOLERANCE


def test_the_items_of_one_call_compute_their_shared_prefix_once(engine, labels):
    """One score call, 6 items behind a new profile: one item computes the profile, the
    other 5 find it cached (under FCFS all 6 are prefilled together and compute it 6x)."""
    profile = "A new user profile: likes maps, tea and quiet trains. " * 8
    n_profile = len(engine.tokenizer.encode(profile)) - 2  # the last tokens may merge
    result = engine.score(profile, [f" item {i}: a map?" for i in range(6)], labels)
    assert result.cached_tokens >= 5 * n_profile


def test_jct_arguments_need_the_jct_policy(tiny_llama_path):
    with pytest.raises(ValueError, match="jct_aging applies with schedule_policy jct"):
        _engine(tiny_llama_path, schedule_policy="fcfs", jct_aging=2.0)
    with pytest.raises(ValueError, match="does not exist"):
        _engine(tiny_llama_path, jct_profile="/no/such/profile.json")


def test_under_memory_pressure_queue_aware_eviction_stays_correct_and_live(
    tiny_llama_path, reference, labels, cpu_costs
):
    """Four users' ~600-token profiles against a 768-token pool (one fits): their items
    arrive interleaved, so profiles are evicted and computed again while others wait.
    Queue-aware eviction (the default) locks the waiting groups' prefixes around SGLang's
    evict: the scores still equal transformers, and every lock is released (a leaked one
    would leave its prefix unevictable and the last rounds without room)."""
    profiles = [f"User {u} likes walks, books, maps and tea; film {u}.\n" * 20 for u in range(4)]
    items = [f"Item {i}: a film. Relevant?" for i in range(3)]
    calls = [(f"{u}-{i}", profiles[u], [item]) for i, item in enumerate(items) for u in range(4)]
    with Engine(tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=768,
                jct_profile=cpu_costs) as small:  # fmt: skip
        assert small.jct_settings.eviction == "queue"
        for _ in range(3):
            answers = _concurrent_scores(small, labels, calls)
            for name, query, its in calls:
                scores = answers[name].scores
                assert max_abs_diff(scores, reference.score(query, its, labels)) < TOLERANCE
            assert sum(a.cached_tokens for a in answers.values()) > 0


def _concurrent_scores(engine, labels, calls) -> dict:
    """Every (name, query, items) sent at once; name -> its ScoreResult."""
    answers = {}

    async def one(name, query, items):
        answers[name] = await engine.async_score(query, items, labels)

    async def everything():
        await asyncio.gather(*(one(*call) for call in calls))

    engine._sgl.loop.run_until_complete(everything())
    return answers
