"""The open-loop load generator of loadgen.py, in-process: requests go to an Engine's
async_score at their scheduled times (Poisson gaps, or all at once for a burst) on the
engine's own event loop, whatever the engine is doing; bounded in time (a deadline after
which what is still outstanding is cancelled and reported unfinished). For machines that
run the engine but no HTTP client stack, and to measure the engine without the server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from harness.loadgen import Outcome, settle


@dataclass(frozen=True)
class ScoreCall:
    """One score request: a query and its items (token ids) and the label token ids."""

    query: list[int]
    items: list[list[int]]
    labels: list[int]


async def _send(engine, call: ScoreCall, index: int, at: float, started: float) -> Outcome:
    await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
    sent = time.perf_counter()
    outcome = Outcome(index, sent - started, None)
    try:
        result = await engine.async_score(call.query, call.items, call.labels)
    except Exception as e:  # a failed request is a row of the results, never the run's end
        outcome.error = f"{type(e).__name__}: {str(e)[:200]}"
        return outcome
    outcome.latency = time.perf_counter() - sent
    outcome.prompt_tokens = result.prompt_tokens
    outcome.cached_tokens = result.cached_tokens
    return outcome


async def _run(engine, calls, times, deadline):
    started = time.perf_counter()
    tasks = [
        asyncio.create_task(_send(engine, call, i, at, started))
        for i, (call, at) in enumerate(zip(calls, times, strict=True))
    ]
    return await settle(tasks, times, deadline, started)


def run(
    engine, calls: list[ScoreCall], times: list[float], deadline: float
) -> tuple[list[Outcome], float]:
    """Sends calls[i] at times[i] (seconds after the start); returns every call's outcome
    (unfinished ones with latency None, error "unfinished") and the run's wall seconds."""
    return engine.run_until_complete(_run(engine, calls, times, deadline))
