"""The parts, as a child runs them on its engine: correctness, the load parts' warm-up,
burst and rates, and the long prompt; and the context every process shares."""

from __future__ import annotations

import json
import math
import os
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
    distinct tokens (a query once per request) per second. t0 / t1: its epoch window (the
    parent reads the forward log's lines launched inside it)."""
    t0 = time.time()
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
        "t0": t0,
        "t1": time.time(),
    }


def settled_forwards(timeout: float = 1.0) -> list[dict]:
    """The forward log once it stops growing (on CUDA a line is written when its forward's
    end event has completed, at the latest when the scheduler goes idle)."""
    seen = forwards()
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.1)
        now = forwards()
        if len(now) == len(seen):
            return now
        seen = now
    return seen


def window_forwards(t0: float, t1: float) -> list[dict]:
    """The forwards launched inside an epoch window (the log's t: launch time)."""
    return [f for f in settled_forwards() if t0 - 0.05 <= f.get("t", 0.0) <= t1]


def rate_runs(
    engine,
    make_calls,
    rates,
    sizes,
    log,
    ends_at: float,
    requests: int | None = None,
    seeds: tuple[int, int] = (1000, 0),
    stop_p99: float | None = None,
) -> tuple[list, list, list]:
    """One Poisson run per rate, each held hold_seconds or hold_requests (stats.
    held_requests), or `requests` each; calls seeded seeds[0] + k, arrivals seeds[1] + k
    (the same in every system). A rate whose run could not end before `ends_at` (epoch
    seconds) is not started; past `stop_p99` (a p99 that far past the bound, or requests
    left unfinished) the higher rates are skipped: the crossing is interpolated below the
    first rate that misses the bound, so they cannot change it. Returns (rows, the rates
    not run, the rates skipped)."""
    rows, not_run, skipped = [], [], []
    for k, rate in enumerate(rates):
        if rows and stop_p99 is not None and _far_past(rows[-1], stop_p99):
            skipped.append(rate)
            continue
        n = requests or stats.held_requests(
            rate, sizes["hold_seconds"], sizes["hold_requests"], sizes["least_requests"]
        )
        calls = make_calls(n, seeds[0] + k)
        times = arrival_times(len(calls), rate, seed=seeds[1] + k)
        if time.time() + times[-1] + sizes["drain_seconds"] > ends_at:
            not_run.append(rate)
            log(f"    rate {rate:.2f}/s: not started (it could not end before the deadline)")
            continue
        t0 = time.time()
        outcomes, wall = engine_loadgen.run(
            engine, calls, times, times[-1] + sizes["drain_seconds"]
        )
        row = {"rate": rate, "held_s": times[-1], **stats.summarize(outcomes, wall)}
        row["t0"], row["t1"] = t0, time.time()
        row["forwards"] = forward_summary(window_forwards(row["t0"], row["t1"]))
        rows.append(row)
        fwd = row["forwards"]
        log(
            f"    rate {rate:.2f}/s held {row['held_s']:.1f} s: {row['completed']}/"
            f"{row['requests']} done, p50 {row['p50']:.3f} s, p99 {row['p99']:.3f} s, "
            f"hits {row['cache_hit_share']:.0%}; {fwd['count']} forwards of "
            f"{fwd['tokens_mean']:.0f} tokens, step p50 {fwd['step_ms_p50']:.1f} ms"
        )
    if skipped:
        log(f"    rates {skipped} skipped: the p99 was past {stop_p99} s below them")
    return rows, not_run, skipped


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


def _far_past(row: dict, p99: float) -> bool:
    return row["p99"] > p99 or row["completed"] < row["requests"]


def load_turn(engine, system: str, part: str, ctx, turn: dict, log) -> dict:
    """A system's timed part, as the parent's turn says: the items part's bursts
    (phase "burst") or one pass of its rate grid (phase "grid"); the recommendation's burst
    probe, then its rates (set by the first system to run the part when none are given)."""
    if part == "items" and turn.get("phase") == "burst":
        return items_bursts(engine, system, ctx, turn["ends_at"], log)
    if part == "items":
        return grid_pass(engine, ctx, turn, log)
    rates, ends_at = turn.get("rates"), turn["ends_at"]
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
    rows, not_run, _ = rate_runs(engine, make, rates, sizes, log, ends_at)
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


def items_bursts(engine, system: str, ctx, ends_at: float, log) -> dict:
    """The items part's bursts of one system (grid["bursts"] of them, each of the same
    fresh requests in every system): its saturation, and its capacity (their mean)."""
    sizes = ctx["sizes"]
    make = part_calls("items", ctx)
    bursts = []
    for k in range(sizes["grid"]["bursts"]):
        deadline = max(1.0, min(120.0, ends_at - time.time()))
        burst = burst_capacity(engine, make(sizes["burst"], 1 + 2 * k), deadline)
        bursts.append(burst)
        log(
            f"    {system} burst {k + 1}: {burst['requests_per_s']:.2f} requests/s, "
            f"{burst['input_tokens_per_s']:.0f} input tokens/s "
            f"({burst['distinct_tokens_per_s']:.0f} distinct)"
        )
    capacity = sum(b["requests_per_s"] for b in bursts) / len(bursts)
    return {"part": "items", "phase": "burst", "bursts": bursts, "capacity": capacity}


def grid_pass(engine, ctx, turn: dict, log) -> dict:
    """One pass of the items grid: the parent's rates, `requests` each (new requests per
    pass, the same in every system), the higher rates skipped once the p99 is far past
    the bound; the crossing of this pass."""
    sizes = ctx["sizes"]
    bound = sizes["items"]["p99"]
    k = turn["pass"]
    rows, not_run, skipped = rate_runs(
        engine,
        part_calls("items", ctx),
        turn["rates"],
        sizes,
        log,
        turn["ends_at"],
        requests=turn["requests"],
        seeds=(2000 + 100 * k, 100 * k),
        stop_p99=sizes["grid"]["stop_p99"] * bound,
    )
    rate, exact = stats.crossing_rate(rows, bound) if rows else (0.0, False)
    return {
        "part": "items",
        "phase": "grid",
        "pass": k,
        "rows": rows,
        "rate_at_p99": rate,
        "rate_exact": exact,
        "sustained_rate": stats.sustained_rate(rows, bound),
        "rates_not_run": not_run,
        "rates_skipped": skipped,
    }


def part_profile(engine, ctx, profile_path: Path | None, log) -> dict:
    """The engine's kernel profile (PREFILLONLY_KERNEL_PROFILE=<path>, set before it
    started): armed for the next N extend forwards by writing N into <path>.arm (the
    scheduler profiles them with torch.profiler, appends one JSON line per forward to
    <path> and removes the .arm file), then bursts of the same few items-shaped requests
    (one forward of ~7.5k tokens on the card: 4 requests of 1,920) until N lines came or
    the bursts ran out; a .arm file still there is removed (disarmed). Returns the lines
    and the windows of the bursts."""
    shape = ctx["sizes"]["profile"]
    n = shape["forwards"]
    out: dict = {"part": "profile", "armed": n, "windows": [], "lines": []}
    if profile_path is None:
        out["note"] = "no profile file (the child was started without the profile part)"
        return out
    arm = Path(f"{profile_path}.arm")
    before = len(_profile_lines(profile_path))
    tmp = arm.with_suffix(".arm.tmp")
    tmp.write_text(str(n))
    os.replace(tmp, arm)
    make = part_calls("items", ctx)
    for k in range(n):
        calls = make(shape["requests"], 500 + k)
        t0 = time.time()
        engine_loadgen.run(engine, calls, [0.0] * len(calls), 120.0)
        out["windows"].append({"kind": "profile", "t0": t0, "t1": time.time()})
        _wait(lambda: not arm.exists() or len(_profile_lines(profile_path)) >= before + n, 3.0)
        if not arm.exists():
            break
    out["bursts"] = len(out["windows"])
    out["left_armed"] = arm.exists()
    arm.unlink(missing_ok=True)
    _wait(lambda: len(_profile_lines(profile_path)) >= before + n, 2.0)
    out["lines"] = _profile_lines(profile_path)[before:]
    got = len(out["lines"])
    if not got:
        out["note"] = (
            "the engine wrote no profile line: its scheduler does not read "
            "PREFILLONLY_KERNEL_PROFILE (the instrument is not in this tree), or it failed"
        )
    log(
        f"    profile: {got} forwards profiled of {n} armed, {out['bursts']} bursts of "
        f"{shape['requests']} requests"
        + (" (still armed after the bursts: disarmed)" if out["left_armed"] else "")
    )
    return out


def _profile_lines(path: Path) -> list[dict]:
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return lines


def _wait(done, seconds: float) -> None:
    until = time.time() + seconds
    while time.time() < until and not done():
        time.sleep(0.1)


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
