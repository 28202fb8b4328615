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


def crossing_rate(rows: list[dict], p99_bound: float) -> tuple[float, bool]:
    """The rate at which P99 reaches the bound, interpolated on log-log axes between the
    last rate that meets it and the next one (P99 grows roughly as a power of the load
    near saturation), so two systems between the same grid points still differ.

    Returns (rate, exact): exact is False when the value is only a bound: the system met
    every rate tried (rate = the highest, "at least"), missed the lowest (rate 0), or
    left requests unfinished at the first miss (its P99 is unknown: rate = the last met)."""
    ordered = sorted(rows, key=lambda r: r["rate"])
    last = None
    for row in ordered:
        if not meets(row, p99_bound):
            break
        last = row
    else:
        return (last["rate"] if last else 0.0), False
    if last is None:
        return 0.0, False
    if row["completed"] != row["requests"] or not row["p99"] > last["p99"] > 0:
        return last["rate"], False
    slope = math.log(row["p99"] / last["p99"]) / math.log(row["rate"] / last["rate"])
    return last["rate"] * (p99_bound / last["p99"]) ** (1 / slope), True


def run_requests(rate: float, seconds: float, least: int, most: int) -> int:
    """How many requests a Poisson run at `rate` sends: enough for `seconds` of arrivals,
    at least `least` (a P99 needs a sample) and at most `most` (the workload's size)."""
    return max(1, min(most, max(least, math.ceil(rate * seconds))))


def held_requests(rate: float, seconds: float, enough: int, least: int = 1) -> int:
    """How many requests a Poisson run at `rate` sends to be held long enough for its P99
    to mean something: `seconds` of arrivals or `enough` requests, whichever comes first
    (a fast rate reaches `enough` sooner; a slow one is held `seconds`), and never fewer
    than `least`."""
    return max(least, 1, min(enough, math.ceil(rate * seconds)))


def counter_share(before: tuple | None, after: tuple | None) -> float | None:
    """The cached share of the prompt tokens served between two readings of a server's
    (prompt, cached) token counters; None when either reading is missing."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def percent(share: float | None) -> str:
    """A share as a whole percentage, "n/r" when it was not reported."""
    return "n/r" if share is None else f"{share:.0%}"


def spread(values: list[float], places: int = 2) -> str:
    """The median and the range of repeated timings: "1.23 (1.10-1.40)"."""
    med = statistics.median(values)
    return f"{med:.{places}f} ({min(values):.{places}f}-{max(values):.{places}f})"
