"""The engine itself on a card (issues 57 and 62): prefillonly's Engine against stock
SGLang at its best per shape, side by side on the same card, model and attention backend
(FlashInfer).

    # on a lent card, through the engine kit (benchmarks/README.md, "The engine on a card"):
    bash scripts/gpu_kit/run_on_card.sh --engine --quick      # the first call: <= 420 s
    bash scripts/gpu_kit/run_on_card.sh --engine --model llama-3.2-1b   # one model, all parts
    # here, what the tests run (tiny shapes, CPU, float32):
    .venv/bin/python benchmarks/gpu_engine.py --tiny --device cpu --out /tmp/gpu_engine

A random-weight model of a published shape (Qwen3-0.6B: SGLang #9748's model; Llama-3.2-1B)
is written once with transformers (bf16 on a card). Three systems, each an Engine in a
process of its own (SGLang ends the process whose engine's worker failed; the run goes on):

- "stock": every prefillonly feature off, SGLang's lpm policy (its best for shared prefixes);
- "stock-mis": stock with SGLang's multi-item scoring (`enable_mis=True`, i.e.
  `--enable-mis`, with `--attention-backend flashinfer`, which it asserts): a request's query
  and items become one sequence, `query <d> item1 <d> item2 ... <d>` (d: SGLang's fixed
  placeholder token, constants.MIS_DELIMITER_TOKEN_ID), one forward under FlashInfer's
  item-aware mask, each item's positions restarting after the query; SGLang turns the radix
  cache, chunked prefill and CUDA graphs off for it. Measured on the items shape (its
  case) and for correctness; it needs FlashInfer, so off CUDA it is skipped, the reason
  written into the results;
- "ours": the defaults (on CUDA, hybrid prefilling's layers through FlashInfer's query
  chunks).

Parts, each written to results.json / results.md as it ends:

- correctness: label log-probabilities (over the whole vocabulary) of cold prompts, a
  shared prefix and its cache hit, a cold query with its items in one call (ours packs the
  items behind the query: one forward, counted from the forward log), and a prompt longer
  than stock's largest batch (ours: one forward, its layers in query chunks; stock: chunked
  prefill; run after the load parts, since it is a first-time kernel path), against a
  float32 transformers forward of the same weights on the same device; stock-mis against
  the sequence it scores (query, delimiter, item at its MIS positions), and, beside it, how
  far that is from query + item's;
- items: SGLang #9748's shape, requests of a 120-token query and 10 items of 180 tokens,
  Poisson arrivals at rates set from the first system's burst capacity (stock's);
  items/s at P99 <= 500 ms; every system's burst also gives its saturation throughput,
  in input tokens/s as Prelude (OpenReview 2026) reports prefill-only serving;
- recommendation: the paper's shape scaled to the card: users with 1-2k-token profiles,
  each request one user's profile and 8 items of 150 tokens, every user's requests spread
  over the run; requests/s at P99 <= --rec-p99 seconds;
- long: a cold 32k-token prompt (1.2k with the tiny sizes): time and the scheduler's peak
  memory above what it held before the forward (prefillonly's memory probe, in engines of
  their own so the probe's synchronisation slows no load run), stock (unchunked) against
  ours (hybrid prefilling).

Warm-up: after its engine starts (and after correctness, which is not timed), each system
runs representative requests of every load part's shape (a burst, a second burst, a single
request; the recommendation's with warm-up users of their own, a miss then a hit each) so
that no JIT compile (FlashInfer, Triton, SGLang's kernels, torch.compile) lands in a burst
probe or a timed rate; its seconds are recorded per part ("warmup"). A 2026-11-26 run
measured a capacity of 0.44 requests/s on Llama-3.2-1B because its first requests compiled.

Rates: few (two by default), each held for --hold-seconds of arrivals or --hold-requests
requests, whichever comes first (15 s / 300), so that a P99 is a percentile of hundreds;
each row reports its requests, those completed and the seconds it was held. The rates are
the first system's burst capacity times --rate-factors, the same for every system.

The graph check (CUDA, --graphs-check): beside stock's and ours' engines a second engine of
each starts with prefill graphs off and answers the same correctness cases (sglang #37606:
breakable graphs gave wrong greedy output when a bucket's memory was reused); if either
system's two engines differ by more than GRAPH_CHECK_TOLERANCE, both systems' load parts
run on their graphs-off engines, and the results say why; otherwise those engines exit
before the load parts. A system whose graph engine failed to start runs on its second.

Diagnostics: each engine's resolved features, whether prefill-only KV is active (and why
not), the JCT scheduler's job-time model and where it came from, and its start warnings
(results.json "engines"); per rate the forwards, their tokens and the share of packed
followers; the forward and hybrid-prefilling logs and every child's reports in
diagnostics.tar.gz beside the results; SGLang's warnings in the log (level "warning").

CUDA graphs (CUDA only; a CPU engine has none): decode graphs off for every system: a
scoring request never decodes, and their capture needs FlashInfer's decode kernels, which
the kit does not carry. Prefill graphs as a CUDA install of SGLang 0.5.23 runs them:
"breakable" (segments captured between eager attention calls, buckets of 4 to
chunked_prefill_size tokens; a batch of more tokens, or padded past 2x, runs eager), left
to SGLang's own default and compatibility rules; it needs cuda-python, which the lent
cards have. stock-mis: off, by SGLang (--enable-mis turns them off). ours: the same as
stock: hybrid prefilling chunks only forwards longer than stock's largest batch
(hybrid_prefill/settings.whole_limit), which no bucket captures; those (the unchunked
long prompts) run eager in every system. (Until 2026-11-27 ours capped its buckets at the
2048-token layer chunk and ran every longer batch eager in query chunks: on the H200 that
served 14 items requests/s to stock's 57.) A system whose
engine fails to start with prefill graphs is started once more without them, alone, and
the results say so.

Time: every system of a model starts at once (--overlap, the default: engine start-up,
graph capture, correctness and warm-up of the three (and the graph check's two) in
parallel, each engine's KV pool bounded to --pool-tokens so they share the card), then the
timed parts run one system at a time while the others idle (sleep_on_idle: an idle
scheduler waits on its socket instead of spinning a core). Parts are measured part by
part (items on stock, ours, stock-mis; then recommendation on stock and ours; then the
late correctness case), each model gets an equal share of --deadline, no turn starts that
cannot do its burst and first rate before its share (turn_seconds), no rate that cannot
end, and a child still running at --deadline + 20 s is killed: the call ends in time and
says what it left out. --quick: Qwen3-0.6B, correctness, items and recommendation, done
370 s after its start (the device call: 420 s with the kit's install).

Token ids are random (seeded), below the tokenizer's size (the tiny models' tokenizer:
SGLang's score API refuses ids past it): the weights are random too, so text would mean
nothing; what is measured is the work, the cache and the scheduling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import engine_loadgen, process_group, stats  # noqa: E402
from harness.engine_loadgen import ScoreCall  # noqa: E402
from harness.loadgen import arrival_times  # noqa: E402

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


# ---------------------------------------------------------------- the model


def build_model(shape_name: str, folder: Path, device: str, dtype: str, seed: int = 0) -> Path:
    """A random-weight model of the shape (transformers' own init), with the tiny models'
    tokenizer (prompts are token ids; only its special tokens are read)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from prefillonly_sgl.models.tiny import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    shape = dict(SHAPES[shape_name])
    arch = shape.pop("arch")
    tokenizer = build_tokenizer()
    config_class, model_class = (
        (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    )
    config = config_class(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


def tokenizer_size(folder: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder))


def reference_logprobs(folder: Path, cases, labels: list[int], device: str, mis: bool = False):
    """The labels' log-probabilities over the whole vocabulary at each case's last position:
    a float32 transformers forward of the same weights on the same device (no cache, one
    prompt at a time; prefillonly_sgl/verification/reference.py). mis: of the sequence SGLang's
    multi-item scoring scores for a query and one item instead (see mis_prompt)."""
    import torch

    from prefillonly_sgl.verification.reference import TransformersReference

    reference = TransformersReference(folder, "float32", device)
    rows = {}
    for name, query, item in cases:
        if mis:
            ids, positions = mis_prompt(query, item)
            with torch.no_grad():
                logits = reference.model(
                    input_ids=reference._ids(ids),
                    position_ids=reference._ids(positions),
                    logits_to_keep=1,
                ).logits[0, -1]
            logprobs = torch.log_softmax(logits.double().cpu(), dim=-1)
        else:
            logprobs = reference.next_token_logprobs(query + item)
        rows[name] = logprobs[labels].tolist()
    del reference
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def mis_prompt(query: list[int], item: list[int]) -> tuple[list[int], list[int]]:
    """What SGLang 0.5.23's multi-item scoring computes for one item, up to the position
    its score is read at (the item's last token; the closing delimiter comes after it):
    the query, the delimiter, the item (TokenizerManagerScoreMixin.
    _build_multi_item_token_sequence), at the positions FlashInferAttnBackend.
    _process_multi_item_scoring gives them: the query 0..q-1, the delimiter q-1, the item
    q.. (as if it followed the query). With one item the item-aware mask is causal, so a
    plain forward with these position ids is the reference."""
    from sglang.srt.constants import MIS_DELIMITER_TOKEN_ID

    q = len(query)
    ids = list(query) + [MIS_DELIMITER_TOKEN_ID] + list(item)
    positions = list(range(q)) + [q - 1] + list(range(q, q + len(item)))
    return ids, positions


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


# ---------------------------------------------------------------- workloads


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


def items_calls(sizes, vocab, labels, n, seed) -> list[ScoreCall]:
    """SGLang #9748's requests: a fresh query and its items (no prefix shared)."""
    rng, shape = random.Random(seed), sizes["items"]
    return [
        ScoreCall(
            random_ids(rng, shape["query"], vocab),
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def user_profiles(sizes, vocab, seed: int = 7) -> list[list[int]]:
    """The users' profiles: the same in every run of the script (seed 7); the warm-up's
    users are others (another seed), so that it caches none of the measured profiles."""
    shape, rng = sizes["rec"], random.Random(seed)
    return [random_ids(rng, rng.randint(*shape["profile"]), vocab) for _ in range(shape["users"])]


def recommendation_calls(sizes, vocab, labels, n, seed, profiles=None) -> list[ScoreCall]:
    """n requests of the same users, each a random user's profile and fresh items: a
    user's requests spread over the run, as users come back (the first request of a user
    in an engine is its profile's miss)."""
    shape = sizes["rec"]
    profiles = profiles if profiles is not None else user_profiles(sizes, vocab)
    rng = random.Random(seed)
    return [
        ScoreCall(
            profiles[rng.randrange(len(profiles))],
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def warmup_passes(part: str, sizes, vocab, labels) -> list[list[ScoreCall]]:
    """Representative requests of a load part, in passes sent as bursts: a burst (large
    batches), a second one (what the first compiled is now loaded), a single request
    (a batch of one). The recommendation's passes use warm-up users of their own: the
    first pass misses their profiles, the later ones hit them (paged prefix + ragged new
    tokens + merge: the kernels a cache hit runs)."""
    n = sizes["warmup_requests"]
    if part == "items":
        calls = items_calls(sizes, vocab, labels, 2 * n + 1, seed=90)
        return [calls[:n], calls[n : 2 * n], calls[2 * n :]]
    profiles = user_profiles(sizes, vocab, seed=8)[:n]
    shape = sizes["rec"]
    rng = random.Random(91)

    def pass_of(users):
        return [
            ScoreCall(
                profile,
                [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
                labels,
            )
            for profile in users
        ]

    return [pass_of(profiles), pass_of(profiles), pass_of(profiles[:1])]


def burst_capacity(engine, calls: list[ScoreCall], deadline: float) -> dict:
    """A burst (all sent at once): the engine at saturation. Requests per second, and
    prefill-only tokens per second as Prelude (OpenReview 2026) reports them: the input
    tokens of the prompts scored (each item's query + item) per second; beside them the
    distinct tokens (a query once per request) per second."""
    outcomes, wall = engine_loadgen.run(engine, calls, [0.0] * len(calls), deadline)
    done = [c for c, o in zip(calls, outcomes, strict=True) if o.latency is not None]
    prompt = sum(len(c.query) * len(c.items) + sum(map(len, c.items)) for c in done)
    distinct = sum(len(c.query) + sum(map(len, c.items)) for c in done)
    return {
        "requests_per_s": stats.summarize(outcomes, wall)["throughput"],
        "input_tokens_per_s": prompt / wall if wall > 0 else 0.0,
        "distinct_tokens_per_s": distinct / wall if wall > 0 else 0.0,
        "completed": len(done),
        "requests": len(calls),
        "wall_s": wall,
    }


# The scheduler's forward log of this process's engine (PREFILLONLY_FORWARD_LOG: one
# line per extend forward, its requests' new tokens and its run_batch's host seconds),
# set by run_system before the engine starts: what a rate's time went to.
_FORWARD_LOG: Path | None = None


def _forwards() -> list[dict]:
    if _FORWARD_LOG is None or not _FORWARD_LOG.exists():
        return []
    from prefillonly_sgl.hooking.events import read_events

    return read_events(_FORWARD_LOG, "forward")


def forward_summary(forwards: list[dict]) -> dict:
    """How many extend forwards, their computed tokens and requests (means), the share of
    their requests that were followers packed behind a leader, and the scheduler's
    run_batch seconds (p50, ms; on CUDA the launch and any wait on the device, not the
    device time alone)."""
    if not forwards:
        return {
            "count": 0,
            "tokens_mean": 0.0,
            "requests_mean": 0.0,
            "packed_share": 0.0,
            "step_ms_p50": 0.0,
        }
    steps = sorted(f.get("step_s", 0.0) for f in forwards)
    requests = sum(len(f["new"]) for f in forwards)
    return {
        "count": len(forwards),
        "tokens_mean": sum(sum(f["new"]) for f in forwards) / len(forwards),
        "requests_mean": requests / len(forwards),
        "packed_share": sum(f.get("packed", 0) for f in forwards) / max(1, requests),
        "step_ms_p50": steps[len(steps) // 2] * 1e3,
    }


def rate_runs(engine, make_calls, rates, sizes, log, ends_at: float) -> tuple[list, list]:
    """One Poisson run per rate, each held hold_seconds or hold_requests (stats.
    held_requests); a rate whose run could not end before `ends_at` (epoch seconds) is not
    started. Returns (rows, the rates not run)."""
    rows, not_run = [], []
    for k, rate in enumerate(rates):
        n = stats.held_requests(
            rate, sizes["hold_seconds"], sizes["hold_requests"], sizes["least_requests"]
        )
        calls = make_calls(n, 1000 + k)
        times = arrival_times(len(calls), rate, seed=k)
        if time.time() + times[-1] + sizes["drain_seconds"] > ends_at:
            not_run.append(rate)
            log(f"    rate {rate:.2f}/s: not started (it could not end before the deadline)")
            continue
        before = len(_forwards())
        outcomes, wall = engine_loadgen.run(
            engine, calls, times, times[-1] + sizes["drain_seconds"]
        )
        row = {"rate": rate, "held_s": times[-1], **stats.summarize(outcomes, wall)}
        row["forwards"] = forward_summary(_forwards()[before:])
        rows.append(row)
        fwd = row["forwards"]
        log(
            f"    rate {rate:.2f}/s held {row['held_s']:.1f} s: {row['completed']}/"
            f"{row['requests']} done, p50 {row['p50']:.3f} s, p99 {row['p99']:.3f} s, "
            f"hits {row['cache_hit_share']:.0%}; {fwd['count']} forwards of "
            f"{fwd['tokens_mean']:.0f} tokens, step p50 {fwd['step_ms_p50']:.1f} ms"
        )
    return rows, not_run


# ---------------------------------------------------------------- parts (a child's)


# The packed-follower case: one call of a cold query and its items ("packed item k"),
# each item against its own reference; ours computes them in one forward.
PACKED = "packed item"
# Cases that take a first-time kernel path (ours: the layers in FlashInfer query chunks;
# stock: chunked prefill): run after the load parts, so that a failure there loses none.
LATE_CASES = ("longer than a batch",)


def correctness_calls(cases, late: bool) -> list[list[tuple]]:
    """The cases as the calls that score them: one case a call, the packed items in one."""
    calls, packed = [], []
    for case in cases:
        if (case[0] in LATE_CASES) != late:
            continue
        if case[0].startswith(PACKED):
            packed.append(case)
        else:
            calls.append([case])
    return calls + ([packed] if packed else [])


def part_correctness(engine, system, ctx, log, late: bool = False) -> list[dict]:
    """Each call's items against the float32 reference; rows carry the label
    log-probabilities (the graph check compares two engines' answers) and, where the
    forward log runs, how many forwards the call took."""
    rows = []
    for call in correctness_calls(ctx["correctness_cases"], late):
        query = call[0][1]
        before = len(_forwards())
        result = engine.score(
            query, [item for _, _, item in call], ctx["labels"], apply_softmax=False
        )
        forwards = len(_forwards()) - before if _FORWARD_LOG is not None else None
        for (name, _, item), scores in zip(call, result.scores, strict=True):
            got = [math.log(max(p, 1e-300)) for p in scores]
            row = {
                "system": system,
                "case": name,
                "tokens": len(query) + len(item),
                "cached_tokens": result.cached_tokens,
                "forwards": forwards,
                "items_in_call": len(call),
                "logprobs": got,
            }
            if system == "stock-mis":
                # exact to its own sequence (the kernels), and how far from query + item's
                row["max_abs_logprob_diff"] = _max_diff(got, ctx["reference_mis"][name])
                row["vs_query_item"] = _max_diff(got, ctx["reference"][name])
            else:
                row["max_abs_logprob_diff"] = _max_diff(got, ctx["reference"][name])
            rows.append(row)
            log(
                f"    {name}: max |logprob diff| {row['max_abs_logprob_diff']:.2e}"
                + (f" ({forwards} forwards for {len(call)} items)" if len(call) > 1 else "")
            )
    return rows


def _max_diff(got, ref) -> float:
    return max(abs(a - b) for a, b in zip(got, ref, strict=True))


def part_calls(part: str, ctx):
    sizes = ctx["sizes"]
    if part == "items":
        return lambda n, seed: items_calls(sizes, ctx["vocab"], ctx["labels"], n, seed)
    return lambda n, seed: recommendation_calls(sizes, ctx["vocab"], ctx["labels"], n, seed)


def warm_up(engine, part: str, ctx, log) -> dict:
    """The warm-up passes of a load part (warmup_passes), each timed; seconds recorded."""
    passes = warmup_passes(part, ctx["sizes"], ctx["vocab"], ctx["labels"])
    seconds, failed = [], 0
    for calls in passes:
        started = time.perf_counter()
        outcomes, _ = engine_loadgen.run(engine, calls, [0.0] * len(calls), 600.0)
        seconds.append(time.perf_counter() - started)
        failed += sum(o.latency is None for o in outcomes)
    entry = {
        "seconds": sum(seconds),
        "passes_s": seconds,
        "requests": sum(len(c) for c in passes),
        "failed": failed,
    }
    log(
        f"    {part} warm-up: {entry['requests']} requests in "
        + " + ".join(f"{s:.1f}" for s in seconds)
        + " s"
    )
    return entry


def load_turn(engine, system: str, part: str, ctx, rates, ends_at: float, log) -> dict:
    """A system's timed part: the burst probe if no rates are set yet (the first system to
    run the part sets them for all), then the rates."""
    sizes = ctx["sizes"]
    make = part_calls(part, ctx)
    bound = sizes["items"]["p99"] if part == "items" else ctx["rec_p99"]
    out = {"part": part}
    # Every system's burst (the same requests): its saturation throughput; the first
    # system's sets the rates for all.
    deadline = max(1.0, min(120.0, ends_at - time.time()))
    burst = burst_capacity(engine, make(sizes["burst"], 1), deadline)
    capacity = burst["requests_per_s"]
    log(
        f"    {system} burst: {capacity:.2f} requests/s, {burst['input_tokens_per_s']:.0f} "
        f"input tokens/s ({burst['distinct_tokens_per_s']:.0f} distinct)"
    )
    if rates is None:
        rates = [round(capacity * f, 3) for f in sizes["rate_factors"]]
        out["capacity"] = {
            "capacity_measured_on": system,
            "burst_capacity_per_s": capacity,
            "burst_requests": sizes["burst"],
            "rates": rates,
            "p99_bound_s": bound,
        }
        log(f"    rates {rates}")
    rows, not_run = rate_runs(engine, make, rates, sizes, log, ends_at)
    rate, exact = stats.crossing_rate(rows, bound) if rows else (0.0, False)
    out["entry"] = {
        "burst": burst,
        "rows": rows,
        "rate_at_p99": rate,
        "rate_exact": exact,
        "sustained_rate": stats.sustained_rate(rows, bound),
        "rates_not_run": not_run,
    }
    return out


# ---------------------------------------------------------------- results


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all (the other side polls for the file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _load_table(entry: dict, unit: float, what: str) -> list[str]:
    lines = [
        f"p99 bound {entry.get('p99_bound_s')} s; rates from {entry.get('capacity_measured_on')}'s "
        f"burst capacity ({entry.get('burst_capacity_per_s', 0):.2f} requests/s)",
        "",
        "| system | rate /s | held s | done | p50 s | p99 s | cache hits | forwards | "
        "tokens / forward | packed | step ms p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, data in entry.get("systems", {}).items():
        for row in data["rows"]:
            fwd = row.get("forwards") or {}
            lines.append(
                f"| {system} | {row['rate']:.2f} | {row.get('held_s', 0):.1f} | "
                f"{row['completed']}/{row['requests']} | {row['p50']:.3f} | {row['p99']:.3f} | "
                f"{row['cache_hit_share']:.0%} | {fwd.get('count', '')} | "
                f"{fwd.get('tokens_mean', 0):.0f} | {fwd.get('packed_share', 0):.0%} | "
                f"{fwd.get('step_ms_p50', 0):.1f} |"
            )
    lines.append("")
    rates = {}
    for system, data in entry.get("systems", {}).items():
        if not data["rows"]:
            lines.append(f"- {system}: no rate ran (the deadline)")
            continue
        rates[system] = data["rate_at_p99"]
        tag = "" if data["rate_exact"] else " (a bound)"
        lines.append(f"- {system}: {data['rate_at_p99'] * unit:.1f} {what} at the bound{tag}")
        if data.get("rates_not_run"):
            lines.append(f"  (rates not run, the deadline: {data['rates_not_run']})")
    stocks = {s: r for s, r in rates.items() if s.startswith("stock") and r}
    ours = next((s for s in rates if s.startswith("ours")), None)
    if ours is not None and stocks:
        for system, rate in stocks.items():
            lines.append(f"- {ours} / {system}: {rates[ours] / rate:.2f}x")
        if len(stocks) > 1:
            best = max(stocks, key=stocks.get)
            lines.append(f"- {ours} / stock's best ({best}): {rates[ours] / stocks[best]:.2f}x")
    bursts = {s: d["burst"] for s, d in entry.get("systems", {}).items() if d.get("burst")}
    if bursts:
        lines += [
            "",
            "Saturation (a burst of the same requests, all sent at once): input tokens/s as "
            "Prelude reports them (each item's query + item), distinct tokens/s (a query once)",
            "",
            "| system | requests/s | input tokens/s | distinct tokens/s | done |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for system, b in bursts.items():
            lines.append(
                f"| {system} | {b['requests_per_s']:.2f} | {b['input_tokens_per_s']:.0f} | "
                f"{b['distinct_tokens_per_s']:.0f} | {b['completed']}/{b['requests']} |"
            )
    return lines + [""]


def markdown(results: dict) -> str:
    lines = [f"# The engine on {results['environment'].get('device_name', 'CPU')}", ""]
    lines += ["```", json.dumps(results["environment"], indent=1), "```", ""]
    lines.append(f"model {results.get('model')}; command `{results.get('command')}`")
    lines.append("")
    graphs, warmups = results.get("graphs", {}), results.get("warmup", {})
    seconds = results.get("part_seconds", {})
    if graphs or results.get("skipped"):
        lines += ["## Systems", ""]
        lines += [
            "| system | engine start s | prefill CUDA graphs | SGLang resolved | warm-up s |",
            "| --- | ---: | --- | --- | --- |",
        ]
        for system, info in graphs.items():
            start = seconds.get(f"{system} start")
            warm = ", ".join(f"{p} {w['seconds']:.1f}" for p, w in warmups.get(system, {}).items())
            resolved = results.get("resolved", {}).get(system, {}).get("prefill_graphs", "")
            lines.append(
                f"| {system} | {'' if start is None else f'{start:.1f}'} | {info['prefill']} | "
                f"{resolved} | {warm} |"
            )
        if graphs:
            decode = {info["decode"] for info in graphs.values()}
            lines += ["", f"Decode CUDA graphs: {'; '.join(sorted(decode))}."]
        for system, reason in results.get("skipped", {}).items():
            lines.append(f"- {system}: skipped: {reason}")
        lines.append("")
    if results.get("engines"):
        lines += ["## Engines as they resolved", ""]
        lines += [
            "| engine | features | prefill-only KV | job-time model | warnings at start |",
            "| --- | --- | --- | --- | --- |",
        ]
        for label, facts in results["engines"].items():
            jct = facts.get("jct_model", {}).get("source", "")
            kv = facts.get("prefill_only_kv_active")
            kv = "" if kv is None else "active" if kv else "off"
            warned = "; ".join(w[:160] for w in facts.get("start_warnings", []))
            features = ", ".join(facts.get("features", []))
            lines.append(f"| {label} | {features} | {kv} | {jct} | {warned} |")
        lines.append("")
    if results.get("graph_check"):
        check = results["graph_check"]
        lines += ["## Prefill graphs on and off (sglang #37606)", ""]
        for system, entry in check.items():
            if isinstance(entry, dict) and entry.get("max_diff") is not None:
                lines.append(
                    f"- {system}: max |logprob diff| on/off {entry['max_diff']:.2e} "
                    f"({entry['case']})"
                )
            elif isinstance(entry, dict):
                lines.append(f"- {system}: {entry.get('note', entry)}")
        lines += [f"- decision: {check.get('decision', 'none')}", ""]
    if results.get("correctness", {}).get("rows"):
        lines += ["## Correctness: max |label logprob diff| against float32 transformers", ""]
        lines += [
            "| system | case | tokens | cached | forwards (items in the call) | max diff | "
            "vs query + item |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in results["correctness"]["rows"]:
            plain = row.get("vs_query_item")
            forwards = row.get("forwards")
            calls = "" if forwards is None else f"{forwards} ({row.get('items_in_call', 1)})"
            lines.append(
                f"| {row['system']} | {row['case']} | {row['tokens']} | {row['cached_tokens']} | "
                f"{calls} | {row['max_abs_logprob_diff']:.2e} | "
                f"{'' if plain is None else f'{plain:.2e}'} |"
            )
        lines.append("")
        if any("vs_query_item" in row for row in results["correctness"]["rows"]):
            lines += [
                "stock-mis against the sequence it scores (query, delimiter, item at its MIS "
                "positions); the last column, against query + item's.",
                "",
            ]
    if "items" in results:
        per = results["sizes"]["items"]["per_request"]
        lines += ["## Items (SGLang #9748's shape)", ""]
        lines += _load_table(results["items"], per, "items/s")
    if "recommendation" in results:
        lines += ["## Recommendation (users behind long profiles)", ""]
        lines += _load_table(results["recommendation"], 1, "requests/s")
    if results.get("long", {}).get("systems"):
        lines += [f"## A cold {results['long']['tokens']}-token prompt", ""]
        lines += [
            "| system | s | forwards | peak MiB above resident |",
            "| --- | ---: | ---: | ---: |",
        ]
        for system, row in results["long"]["systems"].items():
            lines.append(
                f"| {system} | {row['seconds']:.2f} | {row['forwards']} | "
                f"{row['peak_above_resident_mib']:.0f} |"
            )
        lines.append("")
    for part, error in results.get("errors", {}).items():
        lines += [f"## {part}: failed", "", "```", error[-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    import platform

    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    try:
        import sglang

        env["sglang"] = sglang.__version__
    except ImportError:
        pass
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            import flashinfer

            env["flashinfer"] = flashinfer.__version__
        except ImportError:
            pass
    return env


# ---------------------------------------------------------------- arguments


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_engine")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU test)")
    parser.add_argument("--model", choices=sorted(SHAPES), default=None)
    parser.add_argument(
        "--models", default=None, help=f"several, comma-separated ({','.join(MODELS)})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{', '.join(QUICK_MODELS)}, parts {','.join(QUICK_PARTS)}: the first device call "
        f"(done {QUICK_DEADLINE:.0f} s after its start)",
    )
    parser.add_argument(
        "--graphs-check",
        dest="graphs_check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a second engine of stock and of ours with prefill graphs off answers the "
        "correctness cases beside each (sglang #37606); if either system's answers differ, "
        "both run their load parts without graphs (default: on CUDA)",
    )
    parser.add_argument("--parts", default=None, help=f"default {','.join(PARTS)}")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="of stock,stock-mis,ours (stock first: its burst sets the rates)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help=f"seconds from the start by which the run is done (no turn or rate starts that "
        f"could not end before its model's share of it); {DEADLINE:.0f}, --tiny "
        f"{TINY_DEADLINE:.0f}",
    )
    parser.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="start each system's engine after the last one's parts (default: a model's "
        "engines start, and warm up, together; their timed parts still run one at a time)",
    )
    parser.add_argument("--hold-seconds", type=float, help="a rate's arrivals, s (15)")
    parser.add_argument("--hold-requests", type=int, help="... or this many requests (300)")
    parser.add_argument("--rate-factors", help="of the burst capacity, comma-separated (0.8,1.5)")
    parser.add_argument("--burst", type=int, help="requests of the burst probe (48)")
    parser.add_argument("--pool-tokens", type=int, help="each engine's KV pool on a card (131072)")
    parser.add_argument("--rec-p99", type=float, default=1.0, help="recommendation's bound, s")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_engine_work"))
    # A child process's own arguments (the parent runs one per system).
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--graphs", choices=("auto", "off"), default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--ends-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.models:
        models = [m for m in args.models.split(",") if m]
    elif args.model:
        models = [args.model]
    elif args.quick:
        models = list(TINY_QUICK_MODELS if args.tiny else QUICK_MODELS)
    else:
        models = [TINY["model"] if args.tiny else FULL["model"]]
    unknown = sorted(set(models) - set(SHAPES))
    if unknown:
        parser.error(f"unknown models {unknown}: choose from {', '.join(sorted(SHAPES))}")
    args.models = models
    args.model = models[0]
    default_parts = QUICK_PARTS if args.quick else PARTS
    parts = [p for p in (args.parts or ",".join(default_parts)).split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {', '.join(PARTS)}")
    args.parts = parts
    args.systems = [x for x in args.systems.split(",") if x]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    sizes = dict(TINY if args.tiny else FULL)
    for key, value in (
        ("hold_seconds", args.hold_seconds),
        ("hold_requests", args.hold_requests),
        ("burst", args.burst),
        ("pool_tokens", args.pool_tokens),
    ):
        if value is not None:
            sizes[key] = value
    if args.rate_factors:
        sizes["rate_factors"] = tuple(float(f) for f in args.rate_factors.split(","))
    args.sizes = sizes
    if args.deadline is None:
        args.deadline = TINY_DEADLINE if args.tiny else QUICK_DEADLINE if args.quick else DEADLINE
    if args.graphs_check is None:
        args.graphs_check = args.device == "cuda"
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def context(args, folder: Path, references: dict) -> dict:
    """What the parts share, the same in every process (seeded)."""
    sizes = args.sizes
    # SGLang's score API refuses token ids at or past the tokenizer's size (not the LM
    # head's): prompts are drawn below both.
    vocab = min(SHAPES[args.model]["vocab_size"], tokenizer_size(folder))
    rng = random.Random(11)
    labels = sorted(rng.sample(range(1, vocab), sizes["labels"]))
    shared = random_ids(rng, sizes["correctness_prompts"][1], vocab)
    short, long = sizes["correctness_prompts"][0], sizes["correctness_prompts"][2]
    cases = [
        ("cold", random_ids(rng, short, vocab), random_ids(rng, 8, vocab)),
        ("prefix", shared, random_ids(rng, 16, vocab)),
        ("prefix hit", shared, random_ids(rng, 16, vocab)),
        ("longer than a batch", random_ids(rng, long, vocab), random_ids(rng, 8, vocab)),
    ]
    packed = sizes["packed"]
    query = random_ids(rng, packed["query"], vocab)
    cases += [
        (f"{PACKED} {k + 1}", query, random_ids(rng, packed["item"], vocab))
        for k in range(packed["items"])
    ]
    return {
        "sizes": sizes,
        "vocab": vocab,
        "labels": labels,
        "rec_p99": 5.0 if args.tiny else args.rec_p99,
        "correctness_cases": cases,
        "reference": references.get("reference", {}),
        "reference_mis": references.get("reference_mis", {}),
    }


# ---------------------------------------------------------------- a child: one system


def run_system(args) -> int:
    """A child: one system's engine. It starts, runs correctness's early cases (not
    timed) and the warm-ups of its load parts, says it is ready (LABEL.status.json in
    args.turns), then runs the turns the parent gives it (LABEL.turnK.json ->
    LABEL.outK.json), one at a time, until told to exit. LABEL: the system, or
    SYSTEM-nographs for a graph check's second engine. Its forward and hybrid logs are
    LABEL.forwards.jsonl and LABEL.hybrid.jsonl beside them (the run's diagnostics)."""
    started = time.perf_counter()
    system, turns, label = args.system, args.turns, args.label or args.system
    status_path = turns / f"{label}.status.json"
    folder = args.work / args.model
    ctx = context(args, folder, _read_json(turns / "context.json") or {})
    report = {"errors": {}, "warmup": {}, "correctness_rows": []}

    def log(message: str) -> None:
        print(f"[{label} {time.perf_counter() - started:6.1f} s] {message}", flush=True)

    if args.parts == ["long"]:
        return run_long(args, folder, ctx, status_path, log)
    _write_json(status_path, {"phase": "starting"})
    global _FORWARD_LOG
    from prefillonly_sgl.machine.environment import FORWARD_LOG, HYBRID_LOG

    _FORWARD_LOG = turns / f"{label}.forwards.jsonl"
    _FORWARD_LOG.unlink(missing_ok=True)
    os.environ[FORWARD_LOG] = str(_FORWARD_LOG)  # read by the engine's scheduler at start
    os.environ[HYBRID_LOG] = str(turns / f"{label}.hybrid.jsonl")
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as start_warnings:
            warnings.simplefilter("always")
            engine, report["graphs"] = start_engine(system, folder, args, args.sizes, args.graphs)
    except Exception:
        report["errors"][f"{label} start"] = traceback.format_exc()
        log(report["errors"][f"{label} start"])
        _write_json(status_path, {"phase": "failed", "report": report})
        return 1
    report["start_s"] = time.perf_counter() - t0
    # the engine's own warnings (prefill-only KV off and why, a family's features off),
    # not the libraries' deprecation notices
    ours = {str(w.message) for w in start_warnings if issubclass(w.category, RuntimeWarning)}
    report["engine"] = engine_facts(engine, sorted(ours))
    log(f"engine started in {report['start_s']:.1f} s: {json.dumps(report['engine'])}")
    with engine:
        report["resolved"] = resolved_settings(engine)
        if "correctness" in args.parts:
            log("correctness")
            try:
                report["correctness_rows"] = part_correctness(engine, label, ctx, log)
            except Exception:
                report["errors"][f"{label} correctness"] = traceback.format_exc()
                log(report["errors"][f"{label} correctness"])
        for part in [p for p in args.parts if p in LOAD_PARTS]:
            try:
                report["warmup"][part] = warm_up(engine, part, ctx, log)
            except Exception:
                report["errors"][f"{label} {part} warm-up"] = traceback.format_exc()
                log(report["errors"][f"{label} {part} warm-up"])
        _write_json(status_path, {"phase": "ready", "report": report})
        k = 0
        while True:
            turn = _wait_for(turns / f"{label}.turn{k}.json", args.ends_at + GRACE)
            if turn is None or turn.get("exit"):
                break
            part = turn["part"]
            log(f"{part} (turn {k})")
            try:
                if part == LATE_CORRECTNESS:
                    out = {"part": part, "rows": part_correctness(engine, label, ctx, log, True)}
                else:
                    out = load_turn(
                        engine, system, part, ctx, turn.get("rates"), turn["ends_at"], log
                    )
            except Exception:
                out = {"part": part, "error": traceback.format_exc()}
                log(out["error"])
            _write_json(turns / f"{label}.out{k}.json", out)
            k += 1
    _write_json(status_path, {"phase": "done", "report": report})
    return 0


# The turn that runs correctness's late cases (LATE_CASES), after the load parts.
LATE_CORRECTNESS = "correctness-late"


def engine_facts(engine, start_warnings: list[str]) -> dict:
    """What an engine resolved, for the results: its features, whether prefill-only KV
    is active in its scheduler (and why not), what its model's family switched off, the
    JCT scheduler's job-time model (and where it came from), hybrid prefilling's
    settings, and the warnings its start raised."""
    facts: dict = {"features": list(engine.features), "start_warnings": start_warnings}
    try:
        facts["prefill_only_kv_active"] = bool(engine.prefill_only_kv_active)
        facts["features_off"] = dict(engine.config.features_off)
        jct = engine.jct_settings
        if jct is not None:
            facts["jct_model"] = {**jct.model.coefficients(), "source": jct.model.source}
        hybrid = engine.hybrid_settings
        if hybrid is not None:
            facts["hybrid_prefill"] = {k: str(v) for k, v in vars(hybrid).items()}
    except Exception as e:  # an instrument: never the run's end
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts


def _wait_for(path: Path, until: float) -> dict | None:
    while time.time() < until:
        data = _read_json(path)
        if data is not None:
            return data
        time.sleep(0.2)
    return None


def run_long(args, folder, ctx, status_path: Path, log) -> int:
    """A child: one system's cold long prompt, in an engine of its own with the memory
    probe (after a warm-up score of the same kernels)."""
    system = args.system
    rng = random.Random(3)
    prompt = random_ids(rng, ctx["sizes"]["long_tokens"], ctx["vocab"])
    probe = args.work / f"memory-{system}.jsonl"
    probe.unlink(missing_ok=True)
    report: dict = {"errors": {}}
    try:
        engine, _ = start_engine(system, folder, args, ctx["sizes"], args.graphs, probe)
        with engine:
            t0 = time.perf_counter()
            engine.score(prompt[:64], [prompt[64:128]], ctx["labels"])  # warm (kernels)
            report["warmup_s"] = time.perf_counter() - t0
            probe.unlink(missing_ok=True)
            started = time.perf_counter()
            half = len(prompt) // 2
            engine.score(prompt[:half], [prompt[half:]], ctx["labels"])
            seconds = time.perf_counter() - started
        forwards = [json.loads(line) for line in probe.read_text().splitlines()]
        peak = max(f["peak"] - f["resident_before"] for f in forwards)
        report["long"] = {
            "tokens": len(prompt),
            "seconds": seconds,
            "forwards": len(forwards),
            "peak_above_resident_mib": peak / 2**20,
        }
        log(f"long: {seconds:.2f} s, {len(forwards)} forwards, peak +{peak / 2**20:.0f} MiB")
    except Exception:
        report["errors"][f"{system} long"] = traceback.format_exc()
        log(report["errors"][f"{system} long"])
    _write_json(status_path, {"phase": "done", "report": report})
    return 0


# ---------------------------------------------------------------- the parent


class Child:
    """One system's process (a session of its own: killing it kills its engine's workers,
    which hold the card)."""

    def __init__(
        self,
        args,
        model: str,
        system: str,
        parts: list[str],
        turns: Path,
        graphs: str,
        label: str | None = None,
    ):
        self.system, self.parts, self.turns, self.graphs = system, parts, turns, graphs
        self.label = label = label or system
        self.status_path = turns / f"{label}.status.json"
        self.status_path.unlink(missing_ok=True)
        for old in turns.glob(f"{label}.turn*.json"):
            old.unlink()
        for old in turns.glob(f"{label}.out*.json"):
            old.unlink()
        command = [sys.executable, __file__, "--model", model, "--device", args.device]
        command += ["--work", str(args.work), "--system", system, "--parts", ",".join(parts)]
        command += ["--label", label]
        command += ["--turns", str(turns), "--graphs", graphs, "--ends-at", str(args.ends_at)]
        command += ["--rec-p99", str(args.rec_p99), "--burst", str(args.sizes["burst"])]
        command += ["--pool-tokens", str(args.sizes["pool_tokens"])]
        command += ["--hold-seconds", str(args.sizes["hold_seconds"])]
        command += ["--hold-requests", str(args.sizes["hold_requests"])]
        command += ["--rate-factors", ",".join(str(f) for f in args.sizes["rate_factors"])]
        command += ["--tiny"] if args.tiny else []
        self.process = subprocess.Popen(command, start_new_session=True)
        self.turn = 0

    def status(self) -> dict:
        return _read_json(self.status_path) or {}

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, until: float) -> str:
        """ "ready", "failed" (its report says why), "exited" or "late"."""
        while time.time() < until:
            phase = self.status().get("phase")
            if phase in ("ready", "failed"):
                return phase
            if not self.alive():
                return "exited"
            time.sleep(0.2)
        return "late"

    def run_turn(self, part: str, rates, ends_at: float, hard_end: float) -> dict | None:
        k = self.turn
        self.turn += 1
        turn = {"part": part, "rates": rates, "ends_at": ends_at}
        _write_json(self.turns / f"{self.label}.turn{k}.json", turn)
        out_path = self.turns / f"{self.label}.out{k}.json"
        while time.time() < hard_end and self.alive():
            out = _read_json(out_path)
            if out is not None:
                return out
            time.sleep(0.2)
        return _read_json(out_path)

    def request_exit(self) -> None:
        """Tells it to exit (once): its engine shuts down while the parent goes on."""
        if self.alive() and not getattr(self, "exiting", False):
            self.exiting = True
            k = self.turn
            self.turn += 1
            _write_json(self.turns / f"{self.label}.turn{k}.json", {"exit": True})

    def finish(self, limit: float) -> str:
        """Tells it to exit and waits up to `limit` s (then kills it); what happened."""
        self.request_exit()
        try:
            code = self.process.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the process ran past its time ({limit:.0f} s left) and was killed"
        return f"the process ended with code {code}"

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def run_in_group(command: list[str], limit: float) -> tuple[int | None, str]:
    """Runs a command in a process group of its own: one that runs past `limit` seconds
    (a hung engine) is killed with its engine's workers, which hold the card, and so is one
    the user interrupts. Returns its exit code (None: killed) and what to report."""
    code = process_group.run_in_group(command, limit)
    if code is None:
        return None, f"the process ran past {limit:.0f} s and was killed"
    return code, f"the process ended with code {code} (the log has its error)"


def merge_ready(results: dict, system: str, report: dict) -> None:
    """A child's start-up report (engine start, graphs, correctness, warm-ups) into results."""
    if "start_s" in report:
        results["part_seconds"][f"{system} start"] = report["start_s"]
    if "graphs" in report:
        results["graphs"][system] = report["graphs"]
    if report.get("resolved"):
        results["resolved"][system] = report["resolved"]
    if report.get("warmup"):
        results["warmup"][system] = report["warmup"]
    if report.get("correctness_rows"):
        results["correctness"].setdefault("rows", []).extend(report["correctness_rows"])
    if report.get("engine"):
        results["engines"][system] = report["engine"]
    results["errors"].update(report.get("errors", {}))


def merge_turn(results: dict, system: str, part: str, out: dict | None, why: str) -> None:
    if out is None:
        results["errors"][f"{system} {part}"] = f"no result: {why}"
        return
    if "error" in out:
        results["errors"][f"{system} {part}"] = out["error"]
        return
    entry = results.setdefault(part, {})
    if "capacity" in out:
        entry.update(out["capacity"])
    entry.setdefault("systems", {})[system] = out["entry"]


def graph_difference(rows: list[dict], first: str, second: str) -> tuple[float | None, str]:
    """The largest |label log-probability difference| between two engines' answers to the
    same correctness cases, and its case; None when they share no case."""
    answers = {(r["system"], r["case"]): r.get("logprobs") for r in rows}
    worst, where = None, ""
    for (system, case), mine in answers.items():
        theirs = answers.get((second, case))
        if system != first or not mine or not theirs:
            continue
        diff = max(abs(a - b) for a, b in zip(mine, theirs, strict=True))
        if worst is None or diff > worst:
            worst, where = diff, case
    return worst, where


def turn_seconds(sizes: dict, rates) -> float:
    """What a load turn needs at least: its burst and its first rate's hold, each with its
    drain (the first system, before any rate is known: a hold and a drain). rate_runs
    then starts each further rate only where it fits."""
    drain = sizes["drain_seconds"]
    if not rates:
        return sizes["hold_seconds"] + drain
    capacity = rates[0] / sizes["rate_factors"][0]
    held = stats.held_requests(
        rates[0], sizes["hold_seconds"], sizes["hold_requests"], sizes["least_requests"]
    )
    return sizes["burst"] / capacity + drain + held / rates[0] + drain


def save_diagnostics(turns: Path, out: Path) -> None:
    """Everything the engines wrote beside their turns (forward and hybrid logs, each
    engine's status report with its resolved features and correctness answers, each
    turn's result) as one archive beside the results: a device call brings back 8 files."""
    import tarfile

    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "diagnostics.tar.gz", "w:gz") as archive:
        for path in sorted(turns.iterdir()):
            archive.add(path, arcname=f"{turns.name}/{path.name}")


class ModelRun:
    """One model's systems: started (together, or one after another without --overlap),
    then their timed parts, part by part, then the long prompt's engines."""

    def __init__(self, args, model: str, out: Path, started: float, ends: float, log) -> None:
        self.args, self.model, self.out, self.log = args, model, out, log
        self.started, self.ends = started, ends
        self.turns = args.work / "turns" / model
        if self.turns.exists():  # an earlier call's on the same machine: not this run's
            shutil.rmtree(self.turns)
        self.turns.mkdir(parents=True, exist_ok=True)
        self.results = {
            "environment": environment(args.device),
            "command": " ".join(["benchmarks/gpu_engine.py", *args.argv]),
            "model": model,
            "sizes": args.sizes,
            "deadline_s": args.deadline,
            "overlap": args.overlap,
            "errors": {},
            "part_seconds": {},
            "skipped": {},
            "graphs": {},
            "resolved": {},
            "warmup": {},
            "correctness": {},
            "engines": {},
        }

    def save(self) -> None:
        write(self.results, self.out)

    def run(self) -> dict:
        args, results = self.args, self.results
        folder = build_model(self.model, args.work / self.model, args.device, args.dtype)
        self.log(f"model {self.model} at {folder}")
        systems = []
        for system in [s for s in SYSTEMS if s in args.systems]:
            parts = [p for p in args.parts if p in SYSTEM_PARTS[system]]
            reason = skip_reason(system, args.device) if parts else None
            if reason:
                results["skipped"][system] = reason
                self.log(f"{system}: skipped: {reason}")
            elif parts:
                systems.append((system, parts))
        references = {}
        ctx = context(args, folder, {})
        if "correctness" in args.parts:
            cases, labels = ctx["correctness_cases"], ctx["labels"]
            references["reference"] = reference_logprobs(folder, cases, labels, args.device)
            if any(s == "stock-mis" and "correctness" in p for s, p in systems):
                references["reference_mis"] = reference_logprobs(
                    folder, cases, labels, args.device, mis=True
                )
            results["correctness"] = dict(references)
        _write_json(self.turns / "context.json", references)
        engine_systems = [(s, [p for p in parts if p != "long"]) for s, parts in systems]
        engine_systems = [(s, parts) for s, parts in engine_systems if parts]
        if args.overlap:
            self.engines(engine_systems)
        else:
            for system, parts in engine_systems:
                self.engines([(system, parts)])
        for system, parts in systems:
            if "long" in parts:
                self.long(system)
        self.save()
        save_diagnostics(self.turns, self.out)
        return results

    def engines(self, systems: list[tuple[str, list[str]]], graphs: str = "auto") -> None:
        """Starts these systems' engines together (with a graph check's second engine,
        graphs off, beside each of GRAPH_CHECKED), waits for them to be ready, decides
        which engine of a checked system runs the load parts (graph_decision), then runs
        the load parts part by part, system by system, then correctness's late cases; a
        system that failed to start with prefill graphs and has no second engine is
        retried alone without them."""
        results = self.results
        if time.time() > self.ends - self.args.sizes["hold_seconds"]:
            for system, parts in systems:
                results["errors"][f"{system} {'+'.join(parts)}"] = "not started: past the deadline"
            return
        note = " (prefill graphs off)" if graphs == "off" else ""
        self.log(f"starting {', '.join(s for s, _ in systems)}{note}")
        children = {
            system: Child(self.args, self.model, system, parts, self.turns, graphs)
            for system, parts in systems
        }
        checks = {}
        if graphs == "auto" and self.args.graphs_check:
            for system, parts in systems:
                if system in GRAPH_CHECKED and "correctness" in parts:
                    label = f"{system}-{NO_GRAPHS}"
                    self.log(f"starting {label} (the graph check)")
                    checks[system] = Child(
                        self.args, self.model, system, parts, self.turns, "off", label
                    )
        ready, retry = {}, []
        for system, child in children.items():
            if self._wait(child):
                ready[system] = child
            elif graphs == "auto" and self.args.device == "cuda" and system != "stock-mis":
                if system not in checks:
                    retry.append((system, child.parts))
        checked = {s: c for s, c in checks.items() if self._wait(c)}
        active = self.graph_decision(ready, checked)
        for child in [*ready.values(), *checked.values()]:
            if child not in active.values():
                child.request_exit()  # not measured: its memory back to the card now
        self.save()
        order = [s for s in SYSTEMS if s in active]
        for part in LOAD_PARTS:
            for system in [s for s in order if part in active[s].parts]:
                self.turn(active[system], part)
        for system in [s for s in order if "correctness" in active[s].parts]:
            self.late_correctness(active[system])
        everyone = [*ready.values(), *checked.values()]
        for child in everyone:  # every engine shuts down at once
            child.request_exit()
        for child in everyone:
            ended = child.finish(self.args.ends_at + GRACE - time.time())
            if "killed" in ended:
                results["errors"][f"{child.label} exit"] = ended
            results["errors"].update(child.status().get("report", {}).get("errors", {}))
        self.save()
        for system, parts in retry:
            retried = results.setdefault("retried_without_graphs", [])
            retried.append(system)
            self.engines([(system, parts)], graphs="off")

    def _wait(self, child: Child) -> bool:
        """Waits for a child's engine; its start-up report into the results. False (and
        the child killed) when it is not ready."""
        phase = child.wait_ready(self.ends)
        merge_ready(self.results, child.label, child.status().get("report", {}))
        if phase == "ready":
            return True
        if phase == "late":
            self.results["errors"][f"{child.label} start"] = "not ready by its model's deadline"
        elif phase == "exited":
            self.results["errors"].setdefault(f"{child.label} start", child.finish(5))
        self.log(f"{child.label}: {phase}")
        child.kill()
        return False

    def graph_decision(self, ready: dict, checked: dict) -> dict:
        """Which engine of each system runs the load parts. The graph check (sglang
        #37606): each checked system's correctness answers with prefill graphs and
        without; if any system's differ by more than GRAPH_CHECK_TOLERANCE, every checked
        system runs without graphs (both systems alike), and the results say why. A
        system whose graph engine did not start runs on its second engine."""
        active = dict(ready)
        if not checked:
            return active
        rows = self.results["correctness"].get("rows", [])
        check = self.results.setdefault("graph_check", {"tolerance": GRAPH_CHECK_TOLERANCE})
        differ = []
        for system, second in checked.items():
            if system not in ready:
                active[system] = second
                check[system] = {"note": "its engine with graphs did not start"}
                continue
            diff, case = graph_difference(rows, system, second.label)
            check[system] = {"max_diff": diff, "case": case}
            self.log(f"graph check {system}: max |logprob diff| on/off {diff:.2e} ({case})")
            if diff is None or diff > GRAPH_CHECK_TOLERANCE:
                differ.append(system)
        if differ:
            check["decision"] = (
                f"prefill graphs off for {', '.join(checked)}: {', '.join(differ)} answered "
                f"differently with graphs (over {GRAPH_CHECK_TOLERANCE} nats, or no answer to "
                "compare; sglang #37606)"
            )
            active.update(checked)
        else:
            check["decision"] = "prefill graphs on: each checked system answered the same"
        self.log(f"graph check: {check['decision']}")
        return active

    def turn(self, child: Child, part: str) -> None:
        results, sizes = self.results, self.args.sizes
        rates = results.get(part, {}).get("rates")
        need = turn_seconds(sizes, rates)
        if time.time() + need > self.ends:
            results["errors"][f"{child.label} {part}"] = (
                f"not started: past its model's deadline (it needs ~{need:.0f} s)"
            )
            self.log(f"{child.label} {part}: not started (deadline)")
            return
        self.log(f"{child.label}: {part}")
        t0 = time.perf_counter()
        out = child.run_turn(part, rates, self.ends, self.args.ends_at + GRACE)
        results["part_seconds"][f"{child.label} {part}"] = time.perf_counter() - t0
        why = "the process ended" if not child.alive() else "past the deadline"
        merge_turn(results, child.label, part, out, why)
        self.save()

    def late_correctness(self, child: Child) -> None:
        """Correctness's late cases (first-time kernel paths) on a measured engine."""
        results = self.results
        if time.time() > self.ends - 5:
            results["errors"][f"{child.label} {LATE_CORRECTNESS}"] = "not started: deadline"
            return
        self.log(f"{child.label}: {LATE_CORRECTNESS}")
        t0 = time.perf_counter()
        out = child.run_turn(LATE_CORRECTNESS, None, self.ends, self.args.ends_at + GRACE)
        results["part_seconds"][f"{child.label} {LATE_CORRECTNESS}"] = time.perf_counter() - t0
        if out is None or "error" in out:
            why = "the process ended" if not child.alive() else "past the deadline"
            results["errors"][f"{child.label} {LATE_CORRECTNESS}"] = (
                out["error"] if out else f"no result: {why}"
            )
        else:
            results["correctness"].setdefault("rows", []).extend(out["rows"])
        self.save()

    def long(self, system: str) -> None:
        results = self.results
        if time.time() > self.ends - (0 if self.args.tiny else 60):
            results["errors"][f"{system} long"] = "not started: past its model's deadline"
            return
        self.log(f"{system}: long")
        t0 = time.perf_counter()
        child = Child(self.args, self.model, system, ["long"], self.turns, "auto")
        ended = child.finish(self.args.ends_at + GRACE - time.time())
        results["part_seconds"][f"{system} long"] = time.perf_counter() - t0
        report = child.status().get("report")
        if report is None:
            results["errors"][f"{system} long"] = ended
            return
        results["errors"].update(report.get("errors", {}))
        if "long" in report:
            entry = results.setdefault("long", {"tokens": report["long"]["tokens"], "systems": {}})
            entry["systems"][system] = {k: v for k, v in report["long"].items() if k != "tokens"}
            entry["systems"][system]["warmup_s"] = report.get("warmup_s")
        self.save()


def pool_for_the_card(pool_tokens: int) -> int:
    """Five engines share the card during start-up with the graph check (three systems
    and two second engines): Qwen3-0.6B keeps 112 KiB a token, so 131,072-token pools
    take 70 GiB, which an H200 (139 GiB) holds and an H100 (80 GiB) does not; there each
    pool is three quarters (the load parts' working sets still fit, FULL's note)."""
    import torch

    if torch.cuda.get_device_properties(0).total_memory < 100 * 2**30:
        return pool_tokens * 3 // 4
    return pool_tokens


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.device == "cuda":
        # Hybrid prefilling's layers attend through FlashInfer's query chunks: the path
        # this run exists to measure (machine/environment.py: opt-in until it has run on a card).
        os.environ.setdefault("PREFILLONLY_CUDA_QUERY_CHUNKS", "1")
    if args.system:
        return run_system(args)
    args.argv = argv
    if args.device == "cuda" and args.graphs_check and args.pool_tokens is None:
        args.sizes["pool_tokens"] = pool_for_the_card(args.sizes["pool_tokens"])
    started = time.perf_counter()
    args.ends_at = time.time() + args.deadline

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    several = len(args.models) > 1
    runs = {}
    for i, model in enumerate(args.models):
        # Each model its equal share of what is left (the last one: all of it).
        ends = time.time() + (args.ends_at - time.time()) / (len(args.models) - i)
        args.model = model
        out = args.out / model if several else args.out
        runs[model] = ModelRun(args, model, out, started, ends, log).run()
        log(f"{model}: results in {out}")
    if several:
        args.out.mkdir(parents=True, exist_ok=True)
        text = "\n".join(markdown(r) for r in runs.values())
        (args.out / "results.md").write_text(text)
    for results in runs.values():
        print(markdown(results))
    log(f"done; results in {args.out}")
    failed = [e for r in runs.values() for e in r["errors"].values()]
    return 1 if any(not e.startswith("not started") for e in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
