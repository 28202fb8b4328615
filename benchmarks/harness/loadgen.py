"""An open-loop load generator for /v1/score: requests leave at their scheduled times
(a burst: all at once; Poisson: exponential gaps at a given rate) whatever the server is
doing, so a slow server cannot slow the arrivals down, as with real users. Bounded in
count (the workload's requests) and in time (a deadline after which whatever is still
outstanding is cancelled and reported unfinished, never waited for)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Outcome:
    index: int  # the request's position in the workload
    sent: float  # seconds after the run started
    latency: float | None  # None: failed or unfinished
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


def arrival_times(n: int, rate: float | None, seed: int) -> list[float]:
    """n send times in seconds: all 0 for a burst (rate None), else a Poisson process."""
    if rate is None:
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    times, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return times


async def _send(session, url: str, body: dict, index: int, at: float, started: float) -> Outcome:
    await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
    sent = time.perf_counter()
    outcome = Outcome(index, sent - started, None)
    try:
        async with session.post(url + "/v1/score", json=body) as response:
            answer = await response.json(content_type=None)
            if response.status != 200:
                outcome.error = f"HTTP {response.status}: {str(answer)[:200]}"
                return outcome
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        outcome.error = f"{type(e).__name__}: {e}"
        return outcome
    outcome.latency = time.perf_counter() - sent
    usage = answer.get("usage") or {}
    outcome.prompt_tokens = usage.get("prompt_tokens") or 0
    outcome.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return outcome


async def run(
    url: str, bodies: list[dict], times: list[float], deadline: float
) -> tuple[list[Outcome], float]:
    """Sends bodies[i] at times[i]; returns every request's outcome (unfinished ones with
    latency None and error "unfinished") and the run's wall seconds."""
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(_send(session, url, body, i, at, started))
            for i, (body, at) in enumerate(zip(bodies, times))
        ]
        return await settle(tasks, times, deadline, started)


async def settle(tasks, times: list[float], deadline: float, started: float):
    """Waits for the requests' tasks until the deadline (seconds after `started`), cancels
    what is left; returns every request's outcome in order (the cancelled ones latency
    None, error "unfinished") and the run's wall seconds."""
    done, pending = await asyncio.wait(tasks, timeout=deadline)
    wall = time.perf_counter() - started
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    outcomes = [t.result() for t in done]
    for i, task in enumerate(tasks):
        if task in pending:
            outcomes.append(Outcome(i, times[i], None, error="unfinished"))
    return sorted(outcomes, key=lambda o: o.index), wall
