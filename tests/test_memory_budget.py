"""The memory budget's plan (plain Python): sizes, KV bytes per token, the pool left beside
the measured model and activations, and the errors a user sees."""

from __future__ import annotations

import pytest

from prefillonly_sgl.memory.budget import (
    Measurement,
    MemoryBudgetError,
    kv_bytes_per_token,
    parse_size,
    plan_pool,
)

MIB = 2**20
LLAMA_8B = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                hidden_size=4096)  # fmt: skip


@pytest.mark.parametrize(
    "text, size",
    [("6GiB", 6 * 2**30), ("6g", 6 * 2**30), ("512 MiB", 512 * MIB), ("1.5G", 3 * 2**29),
     (1000, 1000), ("2048", 2048), ("1k", 1024)],
)  # fmt: skip
def test_sizes_parse_in_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "six gigs", "-1G", 0, "1 PB", True])
def test_bad_sizes_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="memory size"):
        parse_size(bad)


def test_kv_bytes_per_token_of_known_shapes():
    assert kv_bytes_per_token(LLAMA_8B, "bfloat16") == 131072  # 128 KiB: 2 x 32 x 8 x 128 x 2
    smollm2 = dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   hidden_size=576)  # fmt: skip
    assert kv_bytes_per_token(smollm2, "float32") == 2 * 30 * 3 * 64 * 4
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_bytes_per_token({"hidden_size": 8}, "float32")
    with pytest.raises(ValueError, match="int8"):
        kv_bytes_per_token(LLAMA_8B, "int8")


def measured(before_mib=900, peak_mib=1400, pool_tokens=1000):
    """A 32k-token calibration: 900 MiB resident before it (with the pool), 1400 at peak."""
    return Measurement(32768, pool_tokens, before_mib * MIB, peak_mib * MIB, "cpu")


def test_the_pool_gets_what_the_model_and_activations_leave():
    m = measured()
    kv = 100 * 1024  # the calibration pool held 1000 x 100 KiB of the 900 MiB
    plan = plan_pool(4096 * MIB, m, kv, margin=0.0)
    assert plan.fixed == 900 * MIB - 1000 * kv
    assert plan.activation == 500 * MIB
    assert plan.pool_tokens == (4096 * MIB - plan.fixed - plan.activation) // kv
    assert plan.fixed + plan.activation + plan.pool_bytes <= 4096 * MIB
    with_margin = plan_pool(4096 * MIB, m, kv)  # 5% kept back
    assert with_margin.pool_tokens < plan.pool_tokens
    assert "32,768-token prompt" in with_margin.describe()


def test_a_budget_that_cannot_hold_the_prompt_names_what_takes_the_memory():
    with pytest.raises(MemoryBudgetError, match="1,400 MiB") as error:
        plan_pool(1400 * MIB, measured(pool_tokens=0), 100 * 1024)
    assert "activations 500 MiB" in str(error.value) and "max_prompt_tokens" in str(error.value)


def test_without_prefill_only_kv_the_pool_must_also_hold_the_prompt():
    kv = 10 * 1024
    m = measured(pool_tokens=0)
    enough = plan_pool(2048 * MIB, m, kv)  # ~57k tokens of pool: a 32k prompt fits
    assert enough.pool_tokens > 32768
    assert plan_pool(2048 * MIB, m, kv, prompt_needs_pool=True) == enough
    with pytest.raises(MemoryBudgetError, match="32,768 tokens"):
        plan_pool(1800 * MIB, m, kv, prompt_needs_pool=True)  # ~24k tokens of pool
    assert plan_pool(1800 * MIB, m, kv).pool_tokens > 20000  # with prefill-only KV: fine
