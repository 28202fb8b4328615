"""A memory budget on the real engine (tiny Llama, CPU): the start-up measurement of the
longest promised prompt runs once (a real engine with the scheduler's memory probe), is
saved and reused, and the KV pool SGLang allocates is the one the plan computed; a budget
too small is refused before any engine is left running."""

from __future__ import annotations

import json

import pytest

from prefillonly_sgl import Engine
from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.memory import measurement
from prefillonly_sgl.memory.budget import Measurement, MemoryBudgetError, plan_pool

pytestmark = pytest.mark.slow  # calibration engines

MAX_PROMPT = 2048
POOL = 20000  # tokens the test's budget is chosen to leave for the pool


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFILLONLY_CACHE", str(folder))
        yield folder


def _engine(path, budget, **kwargs):
    return Engine(path, device="cpu", dtype="float32", memory_budget=budget,
                  max_prompt_tokens=MAX_PROMPT, **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def measured(tiny_llama_path, cache):
    """The first start measures (and the 1 MiB budget is then refused by name)."""
    with pytest.raises(MemoryBudgetError, match="1 MiB is too small for 2,048-token") as error:
        _engine(tiny_llama_path, "1MiB")
    (path,) = (cache / "memory-profiles").glob("*.json")
    document = json.loads(path.read_text())
    return path, Measurement(**document["measurement"]), document["key"], str(error.value)


def test_the_measurement_is_of_the_promised_prompt_in_the_scheduler(measured):
    path, m, key, error = measured
    assert m.prompt_tokens == MAX_PROMPT and m.device == "cpu" and m.pool_tokens > 0
    # The scheduler holds SGLang, torch and the model: hundreds of MiB resident.
    assert m.resident_before > 200 * 2**20 and m.peak >= m.resident_before
    assert m.activation > 0
    assert {"hybrid_prefill", "prefill_kv"} <= set(key["features"])
    assert key["max_prompt_tokens"] == MAX_PROMPT
    # the default hybrid prefilling (whole layers in 1024-token query chunks) is what ran
    assert key["hybrid_chunk_size"] == 1024 and key["hybrid_mode"] == "layer"
    assert "activations" in error and "KV pool of at least 256 tokens" in error


def test_the_engine_allocates_the_planned_pool_from_the_saved_measurement(
    tiny_llama_path, measured, capfd
):
    path, m, key, _ = measured
    kv = 2 * 2 * 2 * 16 * 4  # layers x K/V x kv heads x head dim x float32
    budget = int((m.fixed(kv) + m.activation + POOL * kv) / 0.95) + 1
    with _engine(tiny_llama_path, budget) as engine:
        plan = engine.memory_plan
        assert plan.kv_bytes_per_token == kv and plan.source == str(path)
        assert plan.pool_tokens == POOL
        assert engine._sgl.get_server_info()["max_total_num_tokens"] == POOL
        prompt = engine.score([5] * 64, [[7] * (MAX_PROMPT - 64)], [5, 6]).scores
        assert len(prompt) == 1 and abs(sum(prompt[0]) - 1) < 1e-5
    err = capfd.readouterr().err
    assert "measuring" not in err  # the saved measurement was used
    assert f"KV pool (prefix cache) {POOL:,} tokens" in err


def test_the_plan_is_reused_without_starting_an_engine(tiny_llama_path, measured, cache):
    path, m, key, _ = measured

    def no_engine(pool):
        raise AssertionError("the saved measurement should have been used")

    plan = measurement.plan(
        2**30, no_engine, model_path=tiny_llama_path, device="cpu", dtype="float32",
        features=key["features"], chunk_size=1024, hybrid_mode="layer",
        max_prompt_tokens=MAX_PROMPT, log=print,
    )  # fmt: skip
    assert plan == plan_pool(2**30, m, plan.kv_bytes_per_token, source=str(path))


def test_memory_budget_arguments_are_checked_before_anything_starts(tiny_llama_path):
    with pytest.raises(ValueError, match="memory_budget or max_total_tokens"):
        Engine(tiny_llama_path, device="cpu", memory_budget="1GiB", max_total_tokens=4096)
    with pytest.raises(ValueError, match="memory size"):
        Engine(tiny_llama_path, device="cpu", memory_budget="lots")
    with pytest.raises(ValueError, match="max_prompt_tokens applies"):
        Engine(tiny_llama_path, device="cpu", max_prompt_tokens=4096)


def test_without_a_length_the_longest_prompt_the_engine_accepts_is_measured(tiny_llama_path, cache):
    """The default is the context less the few tokens SGLang keeps back (asking for the
    context itself would be refused)."""
    started = []

    def start(pool, probe):
        started.append(pool)
        config = runtime_config.resolve(
            tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=pool
        )
        return Engine.from_config(config.with_memory_probe(probe))  # the probe's file

    kwargs = dict(
        model_path=tiny_llama_path,
        device="cpu",
        dtype="float32",
        features=["prefill_attention", "prefill_kv"],
        chunk_size=None,
        log=print,
    )
    plan = measurement.plan(2**30, start, **kwargs)
    assert len(started) == 1 and 4000 < plan.max_prompt_tokens < 4096  # the tiny context: 4096
    assert measurement.plan(2**30, start, **kwargs) == plan and len(started) == 1  # saved
    with pytest.raises(ValueError, match="above what this engine accepts"):
        measurement.plan(2**30, start, **kwargs, max_prompt_tokens=4096)
