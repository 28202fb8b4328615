"""The parts, as a child runs them on its engine: correctness, the load parts' warm-up,
burst and rates, and the long prompt; and the context every process shares."""

from __future__ import annotations

import json
import math
import random
import time
import traceback
from pathlib import Path

from harness import engine_loadgen, stats
from harness.engine_loadgen import ScoreCall
from harness.loadgen import arrival_times

from card_engine.diagnostics import forward_log_on, forward_summary, forwards
from card_engine.model import tokenizer_size
from card_engine.systems import SHAPES, start_engine
from card_engine.workloads import (
    items_calls,
    random_ids,
    recommendation_calls,
    warmup_passes,
)


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
        before = len(forwards())
        outcomes, wall = engine_loadgen.run(
            engine, calls, times, times[-1] + sizes["drain_seconds"]
        )
        row = {"rate": rate, "held_s": times[-1], **stats.summarize(outcomes, wall)}
        row["forwards"] = forward_summary(forwards()[before:])
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
        before = len(forwards())
        result = engine.score(
            query, [item for _, _, item in call], ctx["labels"], apply_softmax=False
        )
        taken = len(forwards()) - before if forward_log_on() else None
        for (name, _, item), scores in zip(call, result.scores, strict=True):
            got = [math.log(max(p, 1e-300)) for p in scores]
            row = {
                "system": system,
                "case": name,
                "tokens": len(query) + len(item),
                "cached_tokens": result.cached_tokens,
                "forwards": taken,
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
                + (f" ({taken} forwards for {len(call)} items)" if len(call) > 1 else "")
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


# The turn that runs correctness's late cases (LATE_CASES), after the load parts.
LATE_CORRECTNESS = "correctness-late"


def run_long(args, folder, ctx, log) -> dict:
    """A child: one system's cold long prompt, in an engine of its own with the memory
    probe (after a warm-up score of the same kernels); its report."""
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
    return report


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
