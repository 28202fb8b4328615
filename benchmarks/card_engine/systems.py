"""The systems of the card script and their settings: which systems and parts exist, what
each system is measured on, the published model shapes and the run's sizes, and each
system's engine (its Engine arguments, CUDA graphs, the card's KV pool)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Parts of a system's engine (long: an engine of its own per system) and "checks": the card
# checks that never ran on a card (gpu_checks.py's heads, LoRA per request and gpt-oss
# sinks, tests/test_flashinfer_query_chunk.py), side jobs of the call (orchestration.py).
PARTS = ("correctness", "items", "recommendation", "profile", "long", "checks")
# A run without --parts or --quick: every part but the checks (a call of their own:
# run_on_card.sh --checks, or --parts ...,checks).
DEFAULT_PARTS = ("correctness", "items", "recommendation", "profile", "long")
LOAD_PARTS = ("items", "recommendation")
# The order each part's turns run in: stock first, ours next (a deadline cuts the last
# turn, and ours is the one this run exists to measure), then stock's multi-item scoring,
# then ours' A/B variants (issue 83): ours-8k, ours at today's 8,192-token forward cap
# (Engine(jct_batch_tokens=8192); ours' default on CUDA becomes max_prefill_tokens,
# 16,384), and ours-1pass, ours with PREFILLONLY_CUDA_ONE_PASS=1 in its processes (a packed
# group's attention in one FlashInfer paged pass under the item mask).
SYSTEMS = ("stock", "ours", "stock-mis", "ours-8k", "ours-1pass")
# What each system is measured on: multi-item scoring is stock's alternative on the
# items shape (a query and its items in one forward); it keeps no prefix cache, so the
# recommendation shape and the memory probe's long prompt are lpm's and ours'. ours'
# variants: the load parts and the profile (the long prompt is ours').
SYSTEM_PARTS = {
    "stock": DEFAULT_PARTS,
    "ours": DEFAULT_PARTS,
    "stock-mis": ("correctness", "items", "profile"),
    "ours-8k": ("correctness", "items", "recommendation", "profile"),
    "ours-1pass": ("correctness", "items", "recommendation", "profile"),
}
# The Engine arguments and the environment of each variant of ours, beside the defaults.
VARIANT_SETTINGS = {"ours-8k": {"jct_batch_tokens": 8192}}
VARIANT_ENV = {"ours-1pass": {"PREFILLONLY_CUDA_ONE_PASS": "1"}}
# SGLang's fused elementwise ops (RMSNorm, SiLU-and-mul, rotary: sglang.kernels.fused_op.
# BaseFusedOp) are forced onto one backend in every process of every system by SGLang's
# own switch, SGLANG_FORCE_FUSED_OP_BACKEND (its values: sglang.kernels.spec.KernelBackend):
# the kit has no sgl-kernel, so "torch" (forward_native, the kit's boot's default) or
# "torch_compile" (torch.compile(forward_native), each op compiled on its own: SGLang
# 0.5.23's only torch.compile route for a prefill; its --enable-torch-compile compiles
# decode graphs only, and its piecewise "tc_piecewise" prefill backend is not selectable).
FUSED_OPS = {"torch": "torch", "compile": "torch_compile"}
FUSED_OPS_VARIABLE = "SGLANG_FORCE_FUSED_OP_BACKEND"
# The fused-ops A/B in one call: each system named by --fused-ops-ab also runs an engine
# with the other backend, labelled SYSTEM-compile (or SYSTEM-torch), measured on what fits
# beside the grid: correctness's early cases, the items burst (twice) and the profile.
AB_PARTS = ("correctness", "items", "profile")
# Systems whose prefill CUDA graphs are checked: a second engine of each with graphs off
# answers the correctness cases beside it (sglang #37606: breakable graphs gave wrong
# greedy output when a bucket's memory was reused). stock-mis runs without graphs. Off by
# default in the quick call since round 3 (two H200 runs: 1.95e-2 for both, well within).
GRAPH_CHECKED = ("stock", "ours")
# Two engines of one system, graphs on and off, are "the same" when no label log-probability
# of any case differs by more than this (nats): both run the same bf16 kernels, the graph
# on a padded bucket; #37606's failure is wrong answers, not rounding (the engines' distance
# from float32 transformers is 1-5e-2 on the cards so far).
GRAPH_CHECK_TOLERANCE = 0.1
NO_GRAPHS = "nographs"  # a graph check's second engine: label SYSTEM-nographs
MODELS = ("qwen3-0.6b", "llama-3.2-1b")
# --quick: the card call that comes first (issues 73, 83): Qwen3-0.6B (SGLang #9748's model
# and Prelude's), correctness, the items figure (first), recommendation, the profile per
# stage and the card checks, ending by itself within 540 s with the kit's install.
QUICK_MODELS = ("qwen3-0.6b",)
# --quick --tiny (the CPU rehearsal of the card's call): a tiny model of the same family.
TINY_QUICK_MODELS = ("tiny-qwen3",)
QUICK_PARTS = ("correctness", "items", "recommendation", "profile", "checks")
QUICK_AB = ("stock", "ours")  # --quick's fused-ops A/B
# Seconds after the script's start by which it is done (run_on_card.sh installs the kit
# for ~15-20 s before it starts; a child alive GRACE s later is killed): the device call
# ends within 540 s, the per-call limit 600.
DEADLINE = 490.0
QUICK_DEADLINE = 490.0
# --tiny runs on a CPU, where an engine starts in 15 s on an idle 2-core machine and in
# over 100 s when other test runs share it: its own, longer default (below the kit test's
# 900 s limit on the run).
TINY_DEADLINE = 840.0
# A child still alive this long after the deadline is killed with its engine's workers.
GRACE = 20.0
# The side jobs (the card checks) start with the engines and end, or are killed, within
# this many seconds; the timed parts wait for them (a check's engine on the card would
# share it with a measurement).
CHECKS_LIMIT = 170.0
TINY_CHECKS_LIMIT = 420.0
# The card's dense bf16 peak, TFLOP/s (NVIDIA's datasheets, without sparsity): the
# roofline column's denominator. Matched against the device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0}
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
    # The items figure (issue 83, item 8): every system's burst (twice, the same requests
    # in every system), then a grid of rates from the best system's capacity (the mean of
    # its bursts): six between 0.7x and 1.5x, with 0.6x below them for a system whose
    # crossing lies lower; the whole grid twice (new requests each pass); the figure is a
    # system's worse pass. Each rate `requests` sized to fit the call (least-most; a p99
    # of 100 requests is its 99th), a system's pass stopped past stop_p99 x the bound.
    # overhead_s: a rate's time beyond its arrivals and the queue it leaves (its last
    # requests' latency, the forward log's settling), in the sizing.
    grid=dict(
        factors=(0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5),
        passes=2,
        bursts=2,
        least=100,
        most=300,
        stop_p99=2.0,
        overhead_s=0.8,
    ),
    # The recommendation's rates in --quick: held 6 s or 150 requests (the items grid
    # takes the call's time first).
    quick_rec=dict(hold_seconds=6.0, hold_requests=150),
    # The profile part: N forwards armed, bursts of `requests` items-shaped requests (the
    # same in every system: 4 x 1,920 = 7,680 tokens for ours, one forward).
    profile=dict(requests=4, forwards=3, target_tokens=7680),
    # What the parts after the items grid take (s), kept out of the grid's sizing: a
    # recommendation turn, a fused-ops A/B burst turn, a profile turn, a late correctness
    # turn (the first one compiles the query-chunk path), the engines' exit.
    reserve=dict(
        rec_turn=10.0,
        burst_turn=4.0,
        profile_turn=5.0,
        late_turn=4.0,
        late_first=20.0,
        exit=10.0,
    ),
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
    grid=dict(
        factors=(0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5),
        passes=2,
        bursts=2,
        least=6,
        most=8,
        stop_p99=2.0,
        overhead_s=1.5,
    ),
    quick_rec=dict(hold_seconds=2.0, hold_requests=8),
    profile=dict(requests=4, forwards=3, target_tokens=4 * (24 + 4 * 36)),
    reserve=dict(
        rec_turn=25.0, burst_turn=8.0, profile_turn=15.0, late_turn=8.0, late_first=10.0, exit=15.0
    ),
    long_tokens=1200,
    context=2048,
    pool_tokens=4096,
)


# ---------------------------------------------------------------- engines


def skip_reason(system: str, device: str) -> str | None:
    """Why `system` cannot run here (None: it can)."""
    if system == "ours-8k":
        from prefillonly_sgl.features import OPTIONS

        if "jct_batch_tokens" not in OPTIONS:
            return (
                "this tree's Engine takes no jct_batch_tokens argument (no such option in "
                "prefillonly_sgl.features.OPTIONS): ours' forward cap is not a setting yet, "
                "so ours-8k would be ours"
            )
        return None
    if system == "ours-1pass":
        from prefillonly_sgl.machine import environment

        if "PREFILLONLY_CUDA_ONE_PASS" not in environment.VARIABLES:
            return (
                "this tree's engine reads no PREFILLONLY_CUDA_ONE_PASS (not in "
                "prefillonly_sgl/machine/environment.py): ours-1pass would be ours"
            )
        return None
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


def system_note(system: str, device: str) -> str | None:
    """What a system's results mean here beyond its name (None: nothing to add)."""
    if system == "ours-1pass" and device != "cuda":
        return (
            "PREFILLONLY_CUDA_ONE_PASS acts on CUDA only (FlashInfer's paged pass): on "
            f"{device} ours-1pass runs ours' path"
        )
    if system == "ours-8k" and device != "cuda":
        return "on a CPU ours' forward cap is already 8,192 tokens or less: ours-8k is ours"
    return None


def system_env(system: str, fused_ops: str) -> dict[str, str]:
    """The environment a system's child sets before its engine starts (its SGLang
    processes inherit it): the fused ops' backend, and a variant's switches."""
    return {FUSED_OPS_VARIABLE: FUSED_OPS[fused_ops], **VARIANT_ENV.get(system, {})}


def ab_label(system: str, fused_ops: str) -> str:
    """The label of a system's fused-ops A/B engine: its other backend's name."""
    other = "compile" if fused_ops == "torch" else "torch"
    return f"{system}-{other}"


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
    return dict(VARIANT_SETTINGS.get(system, {}))


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
    if (
        args.device == "cuda"
        and graphs != "off"
        and system.startswith("ours")
        and hybrid is not None
    ):
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
    "max_prefill_tokens",
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


def pool_for_the_card(pool_tokens: int, engines: int = 5) -> int:
    """Each engine's KV pool when `engines` share the card during start-up (the systems,
    a graph check's second engines, the fused-ops A/B's): Qwen3-0.6B keeps 112 KiB a
    token, so five 131,072-token pools take 70 GiB, which an H200 (139 GiB) holds and an
    H100 (80 GiB) does not; there each pool is three quarters. More than five engines share
    70 GiB (seven: 93,622 tokens each, still above the load parts' working sets, FULL's
    note); every engine gets the same pool."""
    import torch

    tokens = pool_tokens * 5 // max(5, engines)
    if torch.cuda.get_device_properties(0).total_memory < 100 * 2**30:
        return tokens * 3 // 4
    return tokens
