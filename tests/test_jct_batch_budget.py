"""The JCT scheduler's batch budget (issue 83, item 4; jct_scheduler/batch_budget.py):
on CUDA a batch of whole scoring prompts reaches SGLang's max_prefill_tokens (16,384 by
default) instead of stopping at the chunk size, the prefill graphs' buckets follow, and
the planned adder lets such a batch past SGLang's chunk budget. Plain tests, then one CPU
engine whose chunk is small: prefix groups past it ride whole, together."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from conftest import max_abs_diff, start_logging_forwards

from prefillonly_sgl import Engine
from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.features.jct_scheduler import scheduler_process as jct
from prefillonly_sgl.features.jct_scheduler.batch_budget import (
    SGLANG_MAX_PREFILL_TOKENS,
    batch_token_budget,
    chunk_lift,
    default_batch_tokens,
)
from prefillonly_sgl.features.jct_scheduler.settings import JctSettings
from prefillonly_sgl.hooking.events import read_events


def test_the_budget_is_stocks_unless_batch_tokens_say_otherwise():
    assert default_batch_tokens("cuda") == SGLANG_MAX_PREFILL_TOKENS == 16384
    assert default_batch_tokens("cpu") is None
    assert batch_token_budget(None, 16384, 8192) == 8192  # stock: the smaller of the two
    assert batch_token_budget(None, 16384, -1) == 16384  # chunked prefill off
    assert batch_token_budget(16384, 16384, 8192) == 16384
    assert batch_token_budget(32768, 16384, 8192) == 16384  # never past max_prefill_tokens
    assert batch_token_budget(4096, 16384, 8192) == 4096
    assert chunk_lift(16384, 8192) == 8192
    assert chunk_lift(4096, 8192) == 0 and chunk_lift(16384, None) == 0


def test_settings_take_the_devices_default_and_refuse_nonsense():
    with pytest.raises(ValueError, match="batch tokens must be a positive"):
        JctSettings(batch_tokens=0)


def test_cuda_engines_capture_prefill_graphs_up_to_the_batch_budget(tiny_llama_path):
    def config(**kwargs):
        unset = dict(
            dtype="auto",
            max_total_tokens=None,
            context_length=None,
            memory_budget=None,
            max_prompt_tokens=None,
        )
        return runtime_config.from_engine_args(str(tiny_llama_path), **unset, **kwargs)[0]

    cuda = config(device="cuda")
    assert cuda.settings("jct_scheduler").batch_tokens == 16384
    assert cuda.sglang_defaults()["cuda_graph_max_bs_prefill"] == 16384
    chosen = config(device="cuda", jct_batch_tokens=8192)
    assert chosen.sglang_defaults()["cuda_graph_max_bs_prefill"] == 8192
    # an explicit hybrid limit keeps its buckets; stock's policy keeps SGLang's
    limited = config(device="cuda", hybrid_prefill_whole_up_to=3000)
    assert limited.sglang_defaults()["cuda_graph_max_bs_prefill"] == 3000
    assert (
        "cuda_graph_max_bs_prefill"
        not in config(device="cuda", schedule_policy="lpm").sglang_defaults()
    )
    assert config(device="cpu").settings("jct_scheduler").batch_tokens is None


class _StockAdder:
    def __init__(self, rem_chunk_tokens) -> None:
        self.rem_chunk_tokens = rem_chunk_tokens


def test_the_planned_adder_lets_a_whole_batch_past_the_chunk():
    adder_class = jct._planned_adder(_StockAdder)
    adder_class.plan = SimpleNamespace(planned={"a"}, lift=8192)
    assert adder_class(8192).rem_chunk_tokens == 16384
    assert adder_class(None).rem_chunk_tokens is None  # chunked prefill off: nothing to lift
    adder_class.plan = SimpleNamespace(planned={"a"}, lift=0)  # a batch with a generation
    assert adder_class(8192).rem_chunk_tokens == 8192


# -- a CPU engine: three prefix groups past a small chunk, one forward ---------------------
CHUNK = 96


@pytest.fixture(scope="module")
def engine_and_log(tiny_llama_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("batch-budget") / "forwards.log"
    engine = start_logging_forwards(
        log,
        lambda: Engine(
            tiny_llama_path,
            device="cpu",
            dtype="float32",
            max_total_tokens=4096,
            chunked_prefill_size=CHUNK,
            jct_batch_tokens=1024,
        ),
    )
    with engine:
        yield engine, log


@pytest.mark.slow
def test_whole_groups_past_the_chunk_share_a_forward(engine_and_log, reference, labels):
    """Three cold queries of 60 tokens, each with 3 items of 16 (108 new tokens per group,
    more than the 96-token chunk), sent at once: groups ride whole and together (the first
    may start alone while the others arrive), every score as transformers'. With stock's
    budget (the chunk) no forward could pass 96 tokens."""
    engine, log = engine_and_log
    queries = [[11 + q] * 30 + [200 + q] * 30 for q in range(3)]
    items = [[[300 + 7 * q + i] * 16 for i in range(3)] for q in range(3)]
    before = len(read_events(log, "forward")) if log.exists() else 0

    async def all_at_once():
        return await asyncio.gather(
            *(engine.async_score(queries[q], items[q], labels) for q in range(3))
        )

    results = engine.run_until_complete(all_at_once())
    forwards = read_events(log, "forward")[before:]
    sizes = [sum(f["new"]) for f in forwards]
    group = 60 + 3 * 16  # the query once, then each item
    assert len(forwards) <= 2 and max(sizes) > 2 * CHUNK and sum(sizes) == 3 * group
    assert all(size % group == 0 for size in sizes)  # whole groups only
    for q, result in enumerate(results):
        expected = reference.score(queries[q], items[q], labels)
        assert max_abs_diff(result.scores, expected) < 1e-4
