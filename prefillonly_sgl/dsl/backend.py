"""The interface every DSL backend has (plain Python): ``run`` a job to probability rows.

A backend provides a tokenizer (for label compilation and chat templates) and scores one
compiled request (``score`` / ``ascore``: SGLang's score request -> one row per item). The
base ``run`` / ``arun`` compile the job and send its requests; RemoteBackend overrides
them to use a function's typed endpoint when its server has one. Any object with
``tokenizer``, ``score`` and ``ascore`` can serve as a backend: ``as_backend`` wraps it.
"""

from __future__ import annotations

from typing import Any

from prefillonly_sgl.dsl.job import Job
from prefillonly_sgl.dsl.request import ScoreRequest
from prefillonly_sgl.dsl.runner import DEFAULT_IN_FLIGHT, Progress, asend, send


class Backend:
    """Where DSL calls run. Subclasses give ``tokenizer``, ``score`` and ``ascore``.

    ``prompt_tokens`` / ``cached_tokens``: what this backend object's requests used, as the
    engine or server reported it (0 where it reports none), e.g. for a job's cache-hit
    share."""

    prompt_tokens = 0
    cached_tokens = 0

    def count_usage(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens or 0
        self.cached_tokens += cached_tokens or 0

    @property
    def tokenizer(self) -> Any:
        raise NotImplementedError

    def score(self, request: ScoreRequest) -> list[list[float]]:
        raise NotImplementedError

    async def ascore(self, request: ScoreRequest) -> list[list[float]]:
        raise NotImplementedError

    def applies_calibration(self, function) -> bool:
        """Whether this backend's rows for ``function`` come back already calibrated (a
        server running the function's own endpoint does it there)."""
        return False

    def run(self, job: Job, progress: Progress | None = None) -> list[list[float]]:
        """Probability rows of the job's inputs, in input order."""
        compiled = job.compile(self.tokenizer)
        return compiled.gather(send(self, compiled, progress))

    async def arun(
        self, job: Job, progress: Progress | None = None, max_in_flight: int = DEFAULT_IN_FLIGHT
    ) -> list[list[float]]:
        """``run`` for asyncio code, up to ``max_in_flight`` requests at once."""
        compiled = job.compile(self.tokenizer)
        return compiled.gather(await asend(self, compiled, progress, max_in_flight))


class ScoringObjectBackend(Backend):
    """Any object with ``tokenizer``, ``score`` and ``ascore`` as a Backend."""

    def __init__(self, target) -> None:
        self.target = target

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def score(self, request: ScoreRequest) -> list[list[float]]:
        return self.target.score(request)

    async def ascore(self, request: ScoreRequest) -> list[list[float]]:
        return await self.target.ascore(request)

    def __repr__(self) -> str:
        return repr(self.target)


def is_scoring_object(target) -> bool:
    # Not hasattr(target, "tokenizer"): reading a remote tokenizer property would load it.
    has_tokenizer = hasattr(type(target), "tokenizer") or "tokenizer" in getattr(
        target, "__dict__", {}
    )
    return has_tokenizer and all(callable(getattr(target, m, None)) for m in ("score", "ascore"))
