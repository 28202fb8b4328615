"""A memory budget split between the KV pool and the longest prompt's activations (plain
Python). After the PrefillOnly paper's start-up profile run: measure what the longest
prompt the engine promises to accept needs at its peak, give the rest to the KV pool, which
for a scoring engine is the prefix cache.

    fixed       the scheduler's memory besides the pool and the activations: weights,
                runtime, buffers (measured: resident before the long forward, minus the
                calibration engine's pool)
    activation  the longest prompt's peak during its forward, above what was resident
    pool        (budget x (1 - margin) - fixed - activation) / KV bytes per token
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# Share of the budget left unplanned: allocator rounding, fragmentation, what a
# measurement of one prompt does not see (e.g. a batch's small buffers).
DEFAULT_MARGIN = 0.05
# A pool smaller than this cannot hold a useful prefix cache (a few shared prefixes).
MIN_POOL_TOKENS = 256

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


class MemoryBudgetError(ValueError):
    """The budget cannot hold the model, the longest prompt's activations and a pool."""


def parse_size(value: int | float | str) -> int:
    """Bytes from 8_000_000_000, "6GiB", "6G", "6144 MiB", "1.5g" (binary units)."""
    if isinstance(value, bool):
        raise ValueError(f"memory size must be bytes or e.g. '6GiB', got {value!r}")
    if isinstance(value, (int, float)):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(value).lower())
        if not match:
            raise ValueError(f"memory size must be bytes or e.g. '6GiB', got {value!r}")
        size = float(match.group(1)) * _UNITS[match.group(2)]
    if size <= 0:
        raise ValueError(f"memory size must be positive, got {value!r}")
    return int(size)


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """Bytes one token's K and V take in the pool, over all layers (a Hugging Face
    config.json of a Llama / Qwen2-style model; dtype: the engine's resolved dtype)."""
    try:
        layers = config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    except KeyError as e:
        raise ValueError(f"model config lacks {e.args[0]!r}: cannot size its KV pool") from None
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r} for the KV pool; known: {list(_DTYPE_BYTES)}")
    return 2 * layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class Measurement:
    """One calibration forward of `prompt_tokens` tokens in an engine whose pool held
    `pool_tokens` (bytes: the scheduler's resident memory on CPU, allocated device memory
    on CUDA)."""

    prompt_tokens: int
    pool_tokens: int
    resident_before: int
    peak: int
    device: str

    @property
    def activation(self) -> int:
        return max(0, self.peak - self.resident_before)

    def fixed(self, kv_bytes: int) -> int:
        return max(0, self.resident_before - self.pool_tokens * kv_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MemoryPlan:
    budget: int
    fixed: int
    activation: int
    max_prompt_tokens: int
    kv_bytes_per_token: int
    pool_tokens: int
    margin: float
    source: str  # where the measurement came from (a cached file, or measured now)

    @property
    def pool_bytes(self) -> int:
        return self.pool_tokens * self.kv_bytes_per_token

    def describe(self) -> str:
        return (
            f"memory budget {mib(self.budget)}: model and runtime {mib(self.fixed)}, "
            f"activations of a {self.max_prompt_tokens:,}-token prompt {mib(self.activation)}, "
            f"KV pool (prefix cache) {self.pool_tokens:,} tokens = {mib(self.pool_bytes)}, "
            f"{self.margin:.0%} margin (measured: {self.source})"
        )


def plan_pool(
    budget: int,
    measurement: Measurement,
    kv_bytes: int,
    *,
    prompt_needs_pool: bool = False,
    margin: float = DEFAULT_MARGIN,
    source: str = "",
) -> MemoryPlan:
    """The pool that fits `budget` beside the measured fixed memory and activations.
    prompt_needs_pool: the prompt's own KV lives in the pool (prefill-only KV off), so the
    pool must hold the whole prompt as well."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    fixed = measurement.fixed(kv_bytes)
    activation = measurement.activation
    free = int(budget * (1 - margin)) - fixed - activation
    tokens = max(0, free // kv_bytes)
    least = max(MIN_POOL_TOKENS, measurement.prompt_tokens if prompt_needs_pool else 0)
    if tokens < least:
        need = fixed + activation + least * kv_bytes
        raise MemoryBudgetError(
            f"memory budget {mib(budget)} is too small for {measurement.prompt_tokens:,}-token "
            f"prompts: the model and runtime take {mib(fixed)}, the prompt's activations "
            f"{mib(activation)}, and a KV pool of at least {least:,} tokens {mib(least * kv_bytes)}"
            f" (at least {mib(need / (1 - margin))} with the {margin:.0%} margin); raise the "
            "budget or lower the longest prompt (max_prompt_tokens)"
        )
    return MemoryPlan(
        budget=budget,
        fixed=fixed,
        activation=activation,
        max_prompt_tokens=measurement.prompt_tokens,
        kv_bytes_per_token=kv_bytes,
        pool_tokens=int(tokens),
        margin=margin,
        source=source,
    )
