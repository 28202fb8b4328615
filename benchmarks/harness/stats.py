"""Latency statistics of a load run, and the highest rate a system sustains (plain Python)."""

from __future__ import annotations

import math
import statistics

from harness.loadgen import Outcome


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest-rank method (P99 of 50 values is the largest)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(outcomes: list[Outcome], wall: float) -> dict:
    """Throughput (completed per second of the run), latency mean / P50 / P99 over the
    requests that completed, how many did not, and the prefix-cache hit share."""
    done = [o for o in outcomes if o.latency is not None]
    latencies = [o.latency for o in done]
    prompt = sum(o.prompt_tokens for o in done)
    finished_at = max((o.sent + o.latency for o in done), default=0.0)
    return {
        "requests": len(outcomes),
        "completed": len(done),
        "unfinished": sum(o.error == "unfinished" for o in outcomes),
        "failed": sum(bool(o.error) and o.error != "unfinished" for o in outcomes),
        "errors": sorted({o.error for o in outcomes if o.error and o.error != "unfinished"})[:3],
        "throughput": len(done) / finished_at if finished_at > 0 else 0.0,
        "wall": wall,
        "mean": statistics.fmean(latencies) if latencies else math.nan,
        "p50": quantile(latencies, 0.5),
        "p99": quantile(latencies, 0.99),
        "prompt_tokens": prompt,
        "cached_tokens": sum(o.cached_tokens for o in done),
        "cache_hit_share": sum(o.cached_tokens for o in done) / prompt if prompt else 0.0,
    }


def meets(row: dict, p99_bound: float) -> bool:
    """Every request completed, with P99 within the bound."""
    return row["completed"] == row["requests"] and row["p99"] <= p99_bound


def sustained_rate(rows: list[dict], p99_bound: float) -> float:
    """The highest offered rate at which the system meets the bound, with every lower
    rate met too (a system that recovers at a higher rate only by luck does not count);
    0 if it misses at the lowest rate tried."""
    best = 0.0
    for row in sorted(rows, key=lambda r: r["rate"]):
        if not meets(row, p99_bound):
            break
        best = row["rate"]
    return best


def rate_grid(low: float, high: float, points: int) -> list[float]:
    """`points` rates spaced evenly on a log scale from low to high."""
    if points < 2 or low <= 0 or high <= low:
        raise ValueError(f"need 2+ points over 0 < low < high, got {points}, {low}, {high}")
    step = (high / low) ** (1 / (points - 1))
    return [round(low * step**i, 4) for i in range(points)]
