"""`prefillonly profile`: measure prefill batches on a running Engine (cli.py starts it)
over a grid of (cached tokens, new tokens, batch size), fit the job-time model, save it
where the Engine and `serve` find it (profiles.py).

Each grid point scores random token ids (the content does not change the time): the
query (the cached part) is scored once first so that the radix cache holds it, then the
items (the new part, one per batch member, all different) are timed against it, `repeats`
times; the median is the sample. The cached count used is the one SGLang reports.

    prefillonly profile [--model FOLDER] [--dtype bfloat16] [--max-tokens 2048]
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

from prefillonly_sgl.features.jct_scheduler.jct_model import FitReport, JctModel, Sample, fit
from prefillonly_sgl.features.jct_scheduler.profiles import profile_key, save_profile


@dataclass(frozen=True)
class GridPoint:
    cached: int
    new: int
    batch: int = 1


def default_grid(max_tokens: int) -> list[GridPoint]:
    """Totals from 128 tokens up to max_tokens (doubling), each cold, half cached and 7/8
    cached; short items behind one cached prefix alone and in batches of 2 to 16 (what
    batching amortises: the per-forward cost, and the prefix's attention run once)."""
    totals, total = [], 128
    while total < max_tokens:
        totals.append(total)
        total *= 2
    totals.append(max_tokens)
    points = []
    for total in totals:
        for cached in sorted({0, total // 2, total * 7 // 8}):
            points.append(GridPoint(cached, total - cached))
    for batch in (1, 2, 4, 8, 16):
        for new in (32, 128):
            points.append(GridPoint(cached=min(1024, max_tokens // 2), new=new, batch=batch))
    return points


def measure(engine, grid: list[GridPoint], repeats: int = 3, progress=None, seed: int = 0):
    """One Sample per grid point (the median of `repeats` timed calls)."""
    rng = random.Random(seed)
    vocab = engine.limits.vocab_size
    label = [min(100, vocab - 1)]

    def ids(n: int) -> list[int]:
        return [rng.randrange(min(100, vocab - 1), vocab) for _ in range(n)]

    engine.score(ids(64), [ids(64)], label)  # the first forward is slower: not measured
    samples = []
    for point in grid:
        query = ids(point.cached)
        if point.cached:
            engine.score(query, [ids(1)], label)  # now cached
        seconds, cached = [], 0
        for _ in range(repeats):
            items = [ids(point.new) for _ in range(point.batch)]
            started = time.perf_counter()
            result = engine.score(query, items, label)
            seconds.append(time.perf_counter() - started)
            cached = result.cached_tokens // point.batch
        total = point.cached + point.new
        requests = ((total - cached, total),) * point.batch
        samples.append(Sample(requests, statistics.median(seconds)))
        if progress is not None:
            progress.update(1)
    return samples


# SGLang's fcfs while measuring (the engine `run` is given must have it): the k items of
# one call then run as ONE batch, which is what a batch sample means. (Under the JCT
# scheduler the batches would be whatever the model being replaced decides: a profile
# fitted with the built-in model, which saw short hits as long jobs, measured k items one
# by one and taught that batching never pays.) The scheduler leaves the job time as it is
# (profiles.TIME_NEUTRAL_FEATURES).
MEASURING_POLICY = "fcfs"


def run(
    engine, dtype: str = "auto", max_tokens: int | None = None, repeats: int = 3, out=None
) -> tuple[JctModel, FitReport, str]:
    """Measure on a running Engine (started with schedule_policy=MEASURING_POLICY), fit,
    save; returns (model, report, saved path)."""
    from tqdm.auto import tqdm

    limit = engine.limits.scoring_prompt_tokens
    if max_tokens is None:
        max_tokens = 2048 if engine.device == "cpu" else 16384
    max_tokens = min(max_tokens, limit)
    grid = default_grid(max_tokens)
    print(
        f"[profile] {engine!r}: {len(grid)} batches up to {max_tokens} tokens, {repeats} runs each"
    )
    with tqdm(total=len(grid), desc="profile", unit="batch") as bar:
        samples = measure(engine, grid, repeats, bar)
    key = profile_key(engine.model_path, engine.device, dtype, engine.features)
    jct, report = fit(samples, source="profile")
    path = save_profile(key, jct, report, samples, out)
    return JctModel(**jct.coefficients(), source=str(path)), report, str(path)
