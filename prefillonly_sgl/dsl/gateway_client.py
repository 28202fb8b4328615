"""DSL calls through SGLang's model gateway (`smg`) in front of `prefillonly serve` replicas.

The gateway routes only the routes it knows: /v1/score and the typed `--app` endpoints
are 404 there (its issue #1017), and of /v1/rerank and /v1/classify it forwards just the
standard fields (query + documents; model + input). So a DSL function goes through the
gateway when it is the one those routes serve on the replicas (`serve --rerank NAME`,
`serve --classify NAME`) and its call needs no other argument:

    a ranker call      -> POST /v1/rerank    {query, documents}: the other shared
                          arguments must be at their defaults; x-smg-routing-key: a hash
                          of the query (prefix affinity under consistent hashing)
    a classifier job   -> POST /v1/classify  {model, input: [texts]}: one parameter given,
                          the others at their defaults

The replicas name the function and its labels in each answer (rerank: each result's
meta_info, which the gateway passes through, with the document's label probabilities;
classify: `function`, `labels`), so a call never silently runs another function; the
rows are rebuilt from the label probabilities (a likelihood ranker's: from the query's
token logprobs), exactly as after a /v1/score call. The
bodies and answers are the replicas' wire models (prefillonly_sgl/wire/:
cohere.py, sglang.py).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Callable

from pydantic import ValidationError

from prefillonly_sgl.dsl.job import ClassifyJob, Job, RankJob
from prefillonly_sgl.scoring.call_context import salt_fields
from prefillonly_sgl.scoring.errors import InvalidRequestError, PrefillOnlyError
from prefillonly_sgl.wire.cohere import RerankRequest
from prefillonly_sgl.wire.fields import request_body
from prefillonly_sgl.wire.sglang import (
    ClassifyRequest,
    ClassifyResponse,
    RerankMeta,
    classify_parameter,
)

Post = Callable[..., object]  # (path, JSON body, headers=None) -> decoded JSON answer
CountUsage = Callable[[int, int], None]  # (prompt tokens, cached tokens) of one request
CLASSIFY_CHUNK = 64  # texts per /v1/classify request when the job sets no batch size


class GatewayRouteError(PrefillOnlyError, RuntimeError):
    """The gateway's replicas serve another function at the route this call needs."""


def _name(function) -> str:
    return function.fn.__name__


def _labels(function) -> list[str]:
    return [str(t) for t in function.labels.texts]


def _check_served(function, served_name, served_labels, route: str) -> None:
    if served_name != _name(function) or list(served_labels or []) != _labels(function):
        raise GatewayRouteError(
            f"the gateway's {route} is served by {served_name!r} (labels {served_labels}), "
            f"not {_name(function)!r} (labels {_labels(function)}): start the replicas with "
            f"--{route.rsplit('/', 1)[-1]} {_name(function)}"
        )


def _require_defaults(function, given: dict, job_arguments: dict, route: str) -> None:
    """The job's arguments must be what ``given`` alone validates to (the rest at their
    defaults): the gateway forwards nothing else."""
    if function.inputs.validate((), given) != job_arguments:
        extra = sorted(k for k in job_arguments if k not in given)
        raise InvalidRequestError(
            f"{_name(function)} through the gateway's {route}: only {sorted(given)} reach "
            f"the replicas; {extra} must keep their defaults (call a replica directly, or "
            f"give them defaults that fit)"
        )


def _rank_rows(post: Post, job: RankJob, count_usage: CountUsage) -> list[list[float]]:
    function = job.function
    if "query" not in job.shared:
        raise InvalidRequestError(
            f"{_name(function)} has no 'query' parameter: /v1/rerank cannot serve it"
        )
    query = job.shared["query"]
    _require_defaults(function, {"query": query}, job.shared, "/v1/rerank")
    # "rid" asks a replica called directly for the same SGLang-shaped answer as the
    # gateway gives (apis/ranking.py).
    body = request_body(
        RerankRequest, query=query, documents=list(job.items), rid=None, **salt_fields()
    )
    # A gateway routing by consistent hashing keeps one query on one replica with this
    # key (and walks to the next healthy replica when that one dies); cache_aware
    # routing ignores it.
    key = hashlib.sha1(query.encode()).hexdigest()[:16]
    answer = post("/v1/rerank", body, headers={"x-smg-routing-key": key})
    results = answer["results"] if isinstance(answer, dict) else answer
    metas = [_served(RerankMeta, r.get("meta_info") or {}, "/v1/rerank") for r in results]
    rows: list[list[float] | None] = [None] * len(job.items)
    for result, meta in zip(results, metas):
        _check_served(function, meta.function, meta.labels, "/v1/rerank")
        if meta.method != function.method:
            raise GatewayRouteError(
                f"the gateway's /v1/rerank serves {meta.function} by {meta.method}, not by "
                f"{function.method}"
            )
        # A likelihood ranker's row is its continuation's token logprobs.
        row = meta.token_logprobs if function.scores_continuation else meta.probs
        rows[result["index"]] = list(row or [])
    if any(row is None for row in rows):
        raise GatewayRouteError(f"/v1/rerank answered {len(results)} of {len(rows)} documents")
    count_usage(metas[0].call_prompt_tokens, metas[0].call_cached_tokens)  # the call's
    return rows


def _served(model, answer, route: str):
    """``answer`` read as prefillonly serve's ``model``; GatewayRouteError if it is not."""
    try:
        return model.model_validate(answer)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "answer"
        raise GatewayRouteError(
            f"the gateway's {route} is not served by `prefillonly serve` replicas: its answer "
            f"is no {model.__name__} ({where}: {first['msg']})"
        ) from None


def _classify_bodies(job: ClassifyJob, model: str) -> list[tuple[dict, int]]:
    function = job.function
    try:
        param = classify_parameter(function)
    except ValueError as e:
        raise InvalidRequestError(f"{_name(function)}: {e}") from None
    texts = []
    for arguments in job.inputs:
        value = arguments[param]
        if not isinstance(value, str):
            raise InvalidRequestError(
                f"{_name(function)} through /v1/classify: {param} must be a text, got "
                f"{type(value).__name__}"
            )
        _require_defaults(function, {param: value}, arguments, "/v1/classify")
        texts.append(value)
    size = job.batch_size or CLASSIFY_CHUNK
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
    salt = salt_fields()
    return [(request_body(ClassifyRequest, model=model, input=c, **salt), len(c)) for c in chunks]


def _classify_rows(post: Post, body: dict, function, count_usage: CountUsage):
    answer = _served(ClassifyResponse, post("/v1/classify", body), "/v1/classify")
    _check_served(function, answer.function, answer.labels, "/v1/classify")
    count_usage(answer.usage.prompt_tokens, answer.usage.cached_tokens)
    data = sorted(answer.data, key=lambda d: d.index)
    return [list(d.probs) for d in data]


class GatewayRoute:
    """A function's jobs through the gateway's standard routes (the replicas calibrate);
    ``model``: the model name the gateway registered the replicas under."""

    calibrates_here = False

    def __init__(self, post: Post, model: str, count_usage: CountUsage) -> None:
        self.post, self.model, self.count_usage = post, model, count_usage

    async def rows(self, job: Job, progress, max_in_flight: int) -> list[list[float]]:
        """The job's probability rows (input order), ``max_in_flight`` POSTs at once."""
        post, count_usage = self.post, self.count_usage
        if isinstance(job, RankJob):  # one /v1/rerank call
            calls = [(functools.partial(_rank_rows, post, job, count_usage), len(job))]
        else:  # /v1/classify calls, checked before anything is sent
            calls = [
                (functools.partial(_classify_rows, post, body, job.function, count_usage), n)
                for body, n in _classify_bodies(job, self.model)
            ]
        if progress is not None:
            progress.start()
        gate = asyncio.Semaphore(max_in_flight)

        async def run(call, inputs: int) -> list[list[float]]:
            async with gate:
                answer = await asyncio.to_thread(call)
            if progress is not None:
                progress.update(inputs)
            return answer

        done = await asyncio.gather(*(run(call, inputs) for call, inputs in calls))
        return [row for answer in done for row in answer]
