"""The systems of the card script and their settings: which systems and parts exist, what
each system is measured on, the published model shapes and the run's sizes, and each
system's engine (its Engine arguments, CUDA graphs, the card's KV pool)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PARTS = ("correctness", "items", "recommendation", "long")
LOAD_PARTS = ("items", "recommendation")
# The order each part's turns run in: stock first (its burst sets the rates), ours next
# (a deadline cuts the last turn, and ours is the one this run exists to measure), then
# stock's multi-item scoring.
SYSTEMS = ("stock", "ours", "stock-mis")
# What each system is measured on: multi-item scoring is stock's alternative on the
# items shape (a query and its items in one forward); it keeps no prefix cache, so the
# recommendation shape and the memory probe's long prompt are lpm's and ours'.
SYSTEM_PARTS = {
    "stock": PARTS,
    "ours": PARTS,
    "stock-mis": ("correctness", "items"),
}
# Systems whose prefill CUDA graphs are checked: a second engine of each with graphs off
# answers the correctness cases beside it (sglang #37606: breakable graphs gave wrong
# greedy output when a bucket's memory was reused). stock-mis runs without graphs.
GRAPH_CHECKED = ("stock", "ours")
# Two engines of one system, graphs on and off, are "the same" when no label log-probability
# of any case differs by more than this (nats): both run the same bf16 kernels, the graph
# on a padded bucket; #37606's failure is wrong answers, not rounding (the engines' distance
# from float32 transformers is 1-5e-2 on the cards so far).
GRAPH_CHECK_TOLERANCE = 0.1
NO_GRAPHS = "nographs"  # a graph check's second engine: label SYSTEM-nographs
MODELS = ("qwen3-0.6b", "llama-3.2-1b")
# --quick: the card call that comes first (issue 73): Qwen3-0.6B (SGLang #9748's model and
# Prelude's), correctness, the items shape (stock's best in question: lpm or multi-item
# scoring) and recommendation, ending by itself within 420 s with the kit's install.
QUICK_MODELS = ("qwen3-0.6b",)
# --quick --tiny (the CPU rehearsal of the card's call): a tiny model of the same family.
TINY_QUICK_MODELS = ("tiny-qwen3",)
QUICK_PARTS = ("correctness", "items", "recommendation")
# Seconds after the script's start by which it is done (run_on_card.sh installs the kit
# for ~15-20 s before it starts): a full run's device call has 540 s, the quick one 420 s.
DEADLINE = 490.0
QUICK_DEADLINE = 370.0
# --tiny runs on a CPU, where an engine starts in 15 s on an idle 2-core machine and in
# over 100 s when other test runs share it: its own, longer default (below the kit test's
# 900 s limit on the run).
TINY_DEADLINE = 840.0
# A child still alive this long after the deadline is killed with its engine's workers.
GRACE = 20.0
# Published shapes (config.json of Qwen/Qwen3-0.6B and meta-llama/Llama-3.2-1B).
SHAPES = {
    "qwen3-0.6b": dict(
        arch="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        arch="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny": dict(
        arch="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}
SHAPES["tiny-qwen3"] = dict(SHAPES["tiny"], arch="qwen3")
FULL = dict(
    model="qwen3-0.6b",
    labels=16,
    correctness_prompts=(64, 700, 10000),
    # a cold query and its items in one call: ours packs the items behind the query in
    # one forward (the query's tokens >= the prefix groups' 64-token minimum)
    packed=dict(query=300, item=24, items=4),
    items=dict(query=120, item=180, per_request=10, p99=0.5),
    rec=dict(users=32, profile=(1024, 2048), item=150, per_request=8),
    warmup_requests=8,
    burst=48,
    # Two rates around the burst capacity: one below it, one past it, so that the P99
    # bound is crossed between them (the crossing is interpolated, stats.crossing_rate).
    rate_factors=(0.8, 1.5),
    hold_seconds=15.0,
    hold_requests=300,
    least_requests=24,
    drain_seconds=4.0,
    long_tokens=32768,
    context=40960,
    # Each engine's KV pool on a card: the three engines of a model share it. The load
    # parts' working sets fit (items: a 48-request burst is 144k tokens, of which only a
    # chunked_prefill_size batch is in flight; recommendation: 32 profiles, <= 64k
    # tokens); Qwen3-0.6B keeps 112 KiB per token, so 14 GiB per engine.
    pool_tokens=131072,
)
TINY = dict(
    model="tiny",
    labels=8,
    correctness_prompts=(16, 90, 1100),
    packed=dict(query=80, item=12, items=3),
    items=dict(query=24, item=36, per_request=4, p99=5.0),
    rec=dict(users=4, profile=(96, 160), item=24, per_request=3),
    warmup_requests=2,
    burst=4,
    rate_factors=(0.5, 1.0),
    hold_seconds=2.0,
    hold_requests=8,
    least_requests=4,
    drain_seconds=20.0,
    long_tokens=1200,
    context=2048,
    pool_tokens=4096,
)


# ---------------------------------------------------------------- engines


def skip_reason(system: str, device: str) -> str | None:
    """Why `system` cannot run here (None: it can)."""
    if system != "stock-mis":
        return None
    if device != "cuda":
        return (
            "SGLang's multi-item scoring (--enable-mis) needs FlashInfer's attention backend "
            "(its item-aware mask; SGLang asserts --attention-backend flashinfer), which runs "
            f"on CUDA only; this run's device is {device}"
        )
    if importlib.util.find_spec("flashinfer") is None:
        return "SGLang's multi-item scoring needs FlashInfer, which this interpreter cannot import"
    return None


DECODE_GRAPHS_OFF = (
    "disabled: a scoring request never decodes, and decode graphs' capture needs "
    "FlashInfer's decode kernels, which the kit does not carry"
)


def system_settings(system: str) -> dict:
    """The Engine arguments of each system, as its user would pass them."""
    from prefillonly_sgl import STOCK_SGLANG

    if system == "stock":
        return {**STOCK_SGLANG, "schedule_policy": "lpm"}
    if system == "stock-mis":
        # --enable-mis --attention-backend flashinfer (SGLang asserts the backend; it turns
        # the radix cache, chunked prefill and CUDA graphs off itself). The policy stays
        # SGLang's default: lpm has no prefix cache to match here.
        return {**STOCK_SGLANG, "enable_mis": True, "attention_backend": "flashinfer"}
    return {}


def engine_config(system: str, folder: Path, args, sizes: dict, graphs: str, memory_probe=None):
    """(runtime configuration, SGLang arguments, what the CUDA graphs are) of `system`'s
    engine; graphs "auto" (SGLang's default prefill graphs) or "off"."""
    from prefillonly_sgl.config import runtime_config

    settings = dict(
        device=args.device,
        dtype=args.dtype,
        # the scheduler's warnings (prefill-only KV off and why, hybrid prefilling's layers
        # left whole) in the log; the Engine's default is "error"
        log_level="warning",
        context_length=sizes["context"],
        max_total_tokens=sizes["pool_tokens"] if args.device == "cuda" else sizes["context"] * 2,
        **system_settings(system),
    )
    info = {"prefill": "none (CPU)", "decode": "none (CPU)"}
    if args.device == "cuda":
        settings["cuda_graph_backend_decode"] = "disabled"
        # Sampling (a scoring request samples nothing) in torch rather than FlashInfer's
        # sampling kernels, which the kit lacks too.
        settings["sampling_backend"] = "pytorch"
        # Idle engines (the others of an overlapped run) wait on their sockets instead of
        # each spinning a core; a request still wakes the scheduler at once (zmq).
        settings["sleep_on_idle"] = True
        info["decode"] = DECODE_GRAPHS_OFF
        if system == "stock-mis":
            info["prefill"] = "disabled by SGLang (--enable-mis turns CUDA graphs off)"
        elif graphs == "off":
            settings["cuda_graph_backend_prefill"] = "disabled"
            info["prefill"] = "disabled (the retry after a start with graphs failed)"
        else:
            info["prefill"] = "breakable (SGLang 0.5.23's default on CUDA)"
    config, sglang_args = runtime_config.from_engine_args(
        str(folder),
        memory_budget=None,
        max_prompt_tokens=None,
        **settings,
    )
    hybrid = config.settings("hybrid_prefill")
    if args.device == "cuda" and graphs != "off" and system == "ours" and hybrid is not None:
        # The engine's own rule (runtime_config.sglang_defaults, hybrid_prefill/settings.py):
        # a forward runs in chunks only past stock's largest batch, so its graphs are stock's.
        info["prefill"] += (
            ", as stock's (hybrid prefilling chunks only forwards longer than stock's "
            "largest batch: the unchunked long prompts, eager)"
        )
    if memory_probe is not None:
        config = config.with_memory_probe(memory_probe)
    return config, sglang_args, info


def start_engine(system: str, folder: Path, args, sizes: dict, graphs: str, memory_probe=None):
    from prefillonly_sgl import Engine

    config, sglang_args, info = engine_config(system, folder, args, sizes, graphs, memory_probe)
    return Engine.from_config(config, **sglang_args), info


RESOLVED_KEYS = (
    "attention_backend",
    "schedule_policy",
    "enable_mis",
    "disable_radix_cache",
    "chunked_prefill_size",
    "max_total_tokens",
)


def resolved_settings(engine) -> dict:
    """What SGLang resolved for the engine (its server info), for the results: the
    settings that tell the systems apart, and each phase's CUDA graph backend (with the
    prefill buckets' largest)."""
    try:
        info = engine.get_server_info()
    except Exception as e:  # an instrument: never the run's end
        return {"error": f"{type(e).__name__}: {e}"}
    resolved = {key: str(info[key]) for key in RESOLVED_KEYS if key in info}
    for phase in ("prefill", "decode"):
        config = _field(info.get("cuda_graph_config"), phase)
        if config is None:
            continue
        backend = _field(config, "backend")
        resolved[f"{phase}_graphs"] = str(backend)
        if phase == "prefill" and backend != "disabled":
            resolved["prefill_graphs"] += f" (buckets up to {max(_field(config, 'bs') or [0])})"
    return resolved


def _field(value, key: str):
    """A field of SGLang's graph configuration, as a dict (server info) or its dataclass."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def pool_for_the_card(pool_tokens: int) -> int:
    """Five engines share the card during start-up with the graph check (three systems
    and two second engines): Qwen3-0.6B keeps 112 KiB a token, so 131,072-token pools
    take 70 GiB, which an H200 (139 GiB) holds and an H100 (80 GiB) does not; there each
    pool is three quarters (the load parts' working sets still fit, FULL's note)."""
    import torch

    if torch.cuda.get_device_properties(0).total_memory < 100 * 2**30:
        return pool_tokens * 3 // 4
    return pool_tokens
