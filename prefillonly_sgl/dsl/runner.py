"""Sending a compiled call's requests to a backend, with an optional progress bar."""

from __future__ import annotations

import asyncio

from tqdm.auto import tqdm

from prefillonly_sgl.dsl.request import CompiledCall

DEFAULT_IN_FLIGHT = 4  # requests the async path keeps running at once


def progress_bar(total: int, enabled: bool, name: str):
    return tqdm(total=total, disable=not enabled, desc=name, unit="input")


def send(backend, compiled: CompiledCall, bar=None) -> list[list[list[float]]]:
    """Each request in order (warm-up requests come before the rest of their group)."""
    answers = []
    for request in compiled.requests:
        answers.append(backend.score(request))
        if bar is not None:
            bar.update(len(request.items))
    return answers


async def asend(
    backend, compiled: CompiledCall, bar=None, max_in_flight: int = DEFAULT_IN_FLIGHT
) -> list[list[list[float]]]:
    """The warm-up requests first, then the others, ``max_in_flight`` at a time."""
    gate = asyncio.Semaphore(max_in_flight)
    answers: list = [None] * len(compiled.requests)

    async def run(index: int) -> None:
        request = compiled.requests[index]
        async with gate:
            answers[index] = await backend.ascore(request)
        if bar is not None:
            bar.update(len(request.items))

    warmups = set(compiled.warmups)
    await asyncio.gather(*(run(i) for i in sorted(warmups)))
    await asyncio.gather(*(run(i) for i in range(len(compiled.requests)) if i not in warmups))
    return answers
