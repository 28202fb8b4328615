"""Sending a compiled call's score requests (the default route of every backend), and the
progress bar of batch calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from tqdm.auto import tqdm

from prefillonly_sgl.dsl.request import CompiledCall, ScoreRequest

DEFAULT_IN_FLIGHT = 4  # requests a job keeps running at once
Score = Callable[[ScoreRequest], Awaitable[list[list[float]]]]  # one request -> its rows


class Progress:
    """A batch call's progress bar, in inputs. The route opens it (``start``) once the job
    is compiled and about to be sent, so a call refused before anything is sent shows no
    bar; ``update`` after each finished request. ``total`` may grow before it opens (the
    content-free inputs calibration adds)."""

    def __init__(self, total: int, enabled: bool, name: str) -> None:
        self.total, self.enabled, self.name = total, enabled, name
        self._bar = None

    def start(self) -> None:
        if self.enabled and self._bar is None:
            self._bar = tqdm(total=self.total, desc=self.name, unit="input")

    def update(self, n: int) -> None:
        self.start()
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Route(Protocol):
    """How one function's jobs reach a backend (Backend.choose_route)."""

    calibrates_here: bool  # False: the far side applies the function's calibration

    async def rows(self, job, progress: Progress | None, max_in_flight: int) -> list[list[float]]:
        """The job's rows, in input order."""
        ...


class CompiledRoute:
    """The job compiled to requests with the backend's tokenizer (read when first needed:
    a remote one is loaded then), each answered by the backend (``Backend.answer``)."""

    calibrates_here = True

    def __init__(self, backend) -> None:
        self.backend = backend

    async def rows(self, job, progress=None, max_in_flight=DEFAULT_IN_FLIGHT):
        compiled = job.compile(self.backend.tokenizer)
        answers = await send(self.backend.answer, compiled, progress, max_in_flight)
        return compiled.gather(answers)


async def send(
    score: Score,
    compiled: CompiledCall,
    progress: Progress | None = None,
    max_in_flight: int = DEFAULT_IN_FLIGHT,
) -> list:
    """Every request, ``max_in_flight`` at a time; answers in request order."""
    if progress is not None:
        progress.start()
    gate = asyncio.Semaphore(max_in_flight)
    answers: list = [None] * len(compiled.requests)

    async def run(index: int) -> None:
        request = compiled.requests[index]
        async with gate:
            answers[index] = await score(request)
        if progress is not None:
            progress.update(len(request.items))

    await asyncio.gather(*(run(i) for i in range(len(compiled.requests))))
    return answers
