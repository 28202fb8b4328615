"""Sending a compiled call's requests to a backend, and the progress bar of batch calls."""

from __future__ import annotations

import asyncio

from tqdm.auto import tqdm

from prefillonly_sgl.dsl.request import CompiledCall

DEFAULT_IN_FLIGHT = 4  # requests the async path keeps running at once


class Progress:
    """A batch call's progress bar, in inputs. The backend opens it (``start``) once the
    job is compiled and about to be sent, so a call refused before anything is sent shows
    no bar; ``update`` after each finished request."""

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


def send(backend, compiled: CompiledCall, progress: Progress | None = None):
    """Each request in order; one answer (rows per item) per request."""
    if progress is not None:
        progress.start()
    answers = []
    for request in compiled.requests:
        answers.append(backend.score(request))
        if progress is not None:
            progress.update(len(request.items))
    return answers


async def asend(
    backend,
    compiled: CompiledCall,
    progress: Progress | None = None,
    max_in_flight: int = DEFAULT_IN_FLIGHT,
):
    """Every request, ``max_in_flight`` at a time; answers in request order."""
    if progress is not None:
        progress.start()
    gate = asyncio.Semaphore(max_in_flight)
    answers: list = [None] * len(compiled.requests)

    async def run(index: int) -> None:
        request = compiled.requests[index]
        async with gate:
            answers[index] = await backend.ascore(request)
        if progress is not None:
            progress.update(len(request.items))

    await asyncio.gather(*(run(i) for i in range(len(compiled.requests))))
    return answers
