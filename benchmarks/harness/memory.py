"""One memory budget for every system (issue 38): each system's KV pool is what the budget
leaves after its own measured peak (weights, runtime and the activations of the workload's
longest prompt), by the calibration prefillonly's memory budget uses (memory/measurement.py):
stock SGLang's measured with stock settings (every prefillonly feature off, so the prompt's
whole KV must fit the pool and its activations are unchunked), ours by `serve
--memory-budget` itself at start-up. Measurements are saved per settings, so a rerun only
reads them."""

from __future__ import annotations

import json
import urllib.request

from prefillonly_sgl.memory.budget import MemoryPlan


def stock_plan(model: str, device: str, dtype: str, budget: str, max_prompt: int) -> MemoryPlan:
    """The pool stock SGLang gets under `budget` for prompts up to `max_prompt` tokens."""
    from prefillonly_sgl.config import runtime_config
    from prefillonly_sgl.engine import plan_memory
    from prefillonly_sgl.features import STOCK_SGLANG

    config, _ = runtime_config.from_engine_args(
        model,
        device=device,
        dtype=dtype,
        max_total_tokens=None,
        context_length=None,
        memory_budget=budget,
        max_prompt_tokens=max_prompt,
        **STOCK_SGLANG,
    )
    if config.features:
        raise RuntimeError(f"stock settings left features on: {config.features}")
    return plan_memory(config)


def served_pool(url: str) -> int:
    """The KV pool (tokens) a running server allocated."""
    with urllib.request.urlopen(url + "/get_server_info", timeout=60) as r:
        return int(json.loads(r.read())["max_total_num_tokens"])
