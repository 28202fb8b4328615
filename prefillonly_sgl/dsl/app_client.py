"""The client half of a DSL function's typed endpoint (`prefillonly serve --app`; the
server half is endpoint.py): a job's validated arguments as JSON bodies, the answers as
probability rows. RemoteBackend routes a function's jobs here (EndpointRoute) when its
server serves the function (``RemoteBackend.serves``); the server builds the prompts,
compiles the labels with its own tokenizer and calibrates, so the client needs none.
Results are rebuilt from the rows exactly as after a /v1/score call (same result types,
Enum labels included).

    one classifier call  -> POST <path>                 {arguments}
    a classifier batch   -> POST <path>/batch           {"inputs": [...]}, batch_size each
    a ranker call        -> POST <path>                 {shared arguments, "items": [...]}
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from prefillonly_sgl.dsl.app_models import MARKER, app_models
from prefillonly_sgl.dsl.job import Job, RankJob
from prefillonly_sgl.scoring.call_context import current

Post = Callable[[str, dict], dict]  # (path, JSON body) -> JSON answer


def schema_matches(function, schema: dict | None) -> bool:
    """Whether a request schema from /openapi.json is this function's endpoint: the same
    marker (kind, name, labels) and the same fields."""
    if not schema:
        return False
    models = app_models(function)
    fields = set(schema.get("properties") or {})
    return schema.get(MARKER) == models.marker and fields == set(models.request.model_fields)


@dataclass(frozen=True)
class _Post:
    """One POST of a job; ``inputs``: how many of the job's inputs it answers."""

    path: str
    body: dict
    inputs: int
    results_key: str | None  # where the answer lists its results (None: it is one)

    def rows(self, post: Post, function) -> list[list[float]]:
        answer = post(self.path, self.body)
        results = [answer] if self.results_key is None else answer[self.results_key]
        if function.scores_continuation:  # a likelihood ranker's rows: token logprobs
            return [list(result["token_logprobs"]) for result in results]
        return [[result["probs"][label] for label in function.labels.texts] for result in results]


def _posts(job: Job) -> list[_Post]:
    path = job.function.path
    models = app_models(job.function)
    model = models.request
    # The call's cache salt (call_context.cache_salt), where the endpoint takes one.
    salt = current().salt
    takes_salt = "cache_salt" not in job.function.inputs.model.model_fields  # else a parameter
    salted = {"cache_salt": salt} if salt is not None and takes_salt else {}
    if isinstance(job, RankJob):
        body = model.model_validate({**job.shared, "items": list(job.items), **salted})
        # top_k and score are applied on the client, to the rows
        body = body.model_dump(mode="json", exclude={"top_k", "score"})
        return [_Post(path, body, len(job), "by_input")]
    if job.batch_size is None:  # a call, not a batch: the function's own path
        bodies = [model.model_validate({**a, **salted}).model_dump(mode="json") for a in job.inputs]
        return [_Post(path, body, 1, None) for body in bodies]
    bodies = [models.batch_input.model_validate(a).model_dump(mode="json") for a in job.inputs]
    chunks = [bodies[i : i + job.batch_size] for i in range(0, len(bodies), job.batch_size)]
    return [_Post(f"{path}/batch", {"inputs": c, **salted}, len(c), "results") for c in chunks]


class EndpointRoute:
    """A function's jobs through its typed endpoint (the server calibrates there)."""

    calibrates_here = False

    def __init__(self, post: Post) -> None:
        self.post = post

    async def rows(self, job: Job, progress, max_in_flight: int) -> list[list[float]]:
        """The job's probability rows (input order), ``max_in_flight`` POSTs at once."""
        if progress is not None:
            progress.start()
        gate = asyncio.Semaphore(max_in_flight)

        async def run(one: _Post) -> list[list[float]]:
            async with gate:
                answer = await asyncio.to_thread(one.rows, self.post, job.function)
            if progress is not None:
                progress.update(one.inputs)
            return answer

        done = await asyncio.gather(*(run(one) for one in _posts(job)))
        return [row for answer in done for row in answer]
