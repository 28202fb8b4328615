"""The one interface every DSL front calls: ``await backend.run(job)`` -> probability rows.

A call or batch of a classifier or ranker, a batch job (local or Ray), a typed endpoint
and the built-in APIs all run a job (job.py) this way. ``run``:

1. takes the function's route, chosen once per backend and function (``choose_route``):
   compiled score requests (runner.CompiledRoute, the default), or for a server that has
   them its typed endpoint or its gateway's standard route (remote_backend.py);
2. where the route does not calibrate on the far side, applies calibration as a transform
   of the job (contextual_calibration.py): the content-free inputs of each context this backend has
   no prior for join the same call, so they share the prefix cache with the real inputs;
3. sends it, and returns the caller's rows (calibrated where declared).

The priors belong to the backend, which lives as long as what it talks to: backends.py
keeps one per Engine and per server URL, endpoint.py one per serving runtime.

A subclass gives ``tokenizer`` and ``score`` (one compiled score request -> rows, async),
and ``continuation_logprobs`` where it can serve likelihood rankers.
Synchronous code runs a job with ``backend.wait(backend.run(job))``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
from typing import Any

from prefillonly_sgl.dsl import contextual_calibration
from prefillonly_sgl.dsl.head_route import HeadRoute
from prefillonly_sgl.dsl.job import Job
from prefillonly_sgl.dsl.request import ContinuationRequest, ScoreRequest
from prefillonly_sgl.dsl.request_sending import DEFAULT_IN_FLIGHT, CompiledRoute, Progress, Route
from prefillonly_sgl.scoring.errors import InvalidRequestError


class Backend:
    """Where DSL jobs run. Subclasses give ``tokenizer`` and ``score``.

    ``prompt_tokens`` / ``cached_tokens``: what this backend object's requests used, as the
    engine or server reported it (0 where it reports none), e.g. for a job's cache-hit
    share."""

    prompt_tokens = 0
    cached_tokens = 0
    # The classes of the model's classification head (id2label), or None: it reads labels.
    class_labels: tuple[str, ...] | None = None

    def count_usage(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens or 0
        self.cached_tokens += cached_tokens or 0

    @property
    def tokenizer(self) -> Any:
        raise NotImplementedError

    async def score(self, request: ScoreRequest) -> list[list[float]]:
        """One compiled score request's rows (one per item, label order)."""
        raise NotImplementedError

    async def continuation_logprobs(self, request: ContinuationRequest) -> list[list[float]]:
        """One continuation request's rows (per item the continuation's token logprobs)."""
        raise InvalidRequestError(
            f"{type(self).__name__} cannot score continuations (a likelihood ranker needs an "
            "Engine or a server)"
        )

    async def answer(self, request: ScoreRequest | ContinuationRequest) -> list[list[float]]:
        """A compiled request's rows, by its kind."""
        if isinstance(request, ContinuationRequest):
            return await self.continuation_logprobs(request)
        return request.rows(await self.score(request))

    @functools.cached_property
    def priors(self) -> contextual_calibration.Priors:
        """The content-free priors this backend has measured (calibrated classifiers)."""
        return contextual_calibration.Priors()

    @functools.cached_property
    def _routes(self) -> dict:
        return {}

    async def choose_route(self, function) -> Route:
        """How ``function``'s jobs reach this backend (asked once per function): compiled
        requests, without labels on a model with a classification head."""
        if self.class_labels is not None and not function.scores_continuation:
            return HeadRoute(self, function, self.class_labels)
        return CompiledRoute(self)

    async def run(
        self, job: Job, progress: Progress | None = None, max_in_flight: int = DEFAULT_IN_FLIGHT
    ) -> list[list[float]]:
        """Probability rows of the job's inputs, in input order, up to ``max_in_flight``
        requests at once; calibrated where the function declares it."""
        route = self._routes.get(job.function)
        if route is None:
            route = self._routes[job.function] = await self.choose_route(job.function)
        transform = (
            contextual_calibration.transform(job, self.priors) if route.calibrates_here else None
        )
        if transform is None:
            return await route.rows(job, progress, max_in_flight)
        if progress is not None:
            progress.total = len(transform.job)
        rows = await route.rows(transform.job, progress, max_in_flight)
        return transform.finish(rows, self.priors)

    def wait(self, coroutine):
        """Run one of this backend's coroutines to the end from synchronous code."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coroutine)
        # Synchronous code on a running loop (a notebook cell) cannot re-enter it: the
        # coroutine gets a loop of its own in a worker thread, in this context (the
        # caller's cache_salt, scoring/cache_salts.py: a thread does not inherit it).
        context = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(context.run, asyncio.run, coroutine).result()
