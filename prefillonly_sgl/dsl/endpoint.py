"""DSL functions as typed HTTP endpoints: what ``prefillonly serve --app FILE`` exposes for
each classifier and ranker declared in FILE (plain Python; SGLang stays on the server side).
The client half (what RemoteBackend posts) is app_client.py; the models are app_models.py.

    POST /apps/<name>          classifier: the function's arguments -> <name>Result
    POST /apps/<name>/batch    classifier: {"inputs": [arguments, ...]} -> {"results": [...]}
    POST /apps/<name>          ranker: shared arguments + "items" (+ "top_k", "score")
                               -> <name>Ranking

(``path=`` on the decorator replaces /apps/<name>.) The handler builds the call's job and
runs it on the server's own scoring path (``context.score``, the checks of /v1/score)
through the runtime's one backend (``server_backend``): it compiles the prompts and labels
with the server's tokenizer, as a local call does, and keeps the calibration priors it
measures for the server's lifetime.

Labels are checked once, before SGLang starts (``check_tokenizer``, with the tokenizer the
server will use): the function is called with sample arguments (defaults, else "example" /
0 / the first Literal value ...) and its labels compiled after that prompt, so a label that
cannot be scored there stops the start in seconds with a message naming it. When no sample
call can be made the check is left to the requests, which then get a 400 naming the label.
"""

from __future__ import annotations

import enum
import inspect
import logging
import types
import typing
from typing import Any

from pydantic import BaseModel

from prefillonly_sgl.dsl.app_models import app_models
from prefillonly_sgl.dsl.backends.server import server_backend
from prefillonly_sgl.dsl.job import ClassifyJob, RankJob
from prefillonly_sgl.scoring.labels import LabelError
from prefillonly_sgl.server.endpoints import EndpointSpec

logger = logging.getLogger(__name__)


def _arguments(function, body: BaseModel) -> dict:
    return {name: getattr(body, name) for name in function.inputs.params}


def classifier_endpoints(function) -> list[EndpointSpec]:
    models = app_models(function)
    name = function.fn.__qualname__
    labels = ", ".join(function.labels.texts)

    async def classify(body, context):
        job = ClassifyJob(function, (_arguments(function, body),))
        return function.results(await server_backend(context).run(job))[0]

    async def classify_batch(body, context):
        arguments = tuple(_arguments(function, x) for x in body.inputs)
        job = ClassifyJob(function, arguments, function.batch_size)
        rows = await server_backend(context).run(job)
        return models.batch_response(results=function.results(rows))

    check = _label_check(function)
    return [
        EndpointSpec(
            function.path,
            models.request,
            models.response,
            classify,
            summary=f"{name}: classify one input ({labels})",
            description=inspect.getdoc(function.fn),
            check_tokenizer=check,
        ),
        EndpointSpec(
            f"{function.path}/batch",
            models.batch_request,
            models.batch_response,
            classify_batch,
            summary=f"{name}: classify many inputs (results in input order)",
            description=inspect.getdoc(function.fn),
            count_prompts=lambda body: _count(body, "inputs"),
        ),
    ]


def ranker_endpoint(function) -> EndpointSpec:
    models = app_models(function)

    async def rank(body, context):
        job = RankJob(function, _arguments(function, body), tuple(body.items))
        rows = await server_backend(context).run(job)
        return function.ranking(list(body.items), rows, body.top_k, body.score)

    return EndpointSpec(
        function.path,
        models.request,
        models.response,
        rank,
        summary=f"{function.fn.__qualname__}: rank items, best first",
        description=inspect.getdoc(function.fn),
        count_prompts=lambda body: _count(body, "items"),
        check_tokenizer=_label_check(function),
    )


def _count(body: dict, field: str) -> int:
    value = body.get(field)
    return len(value) if isinstance(value, list) else 1


# -- the start-up check of the labels ----------------------------------------------------------


def _label_check(function):
    def check_tokenizer(tokenizer) -> None:
        if function.scores_continuation:
            return  # no labels to compile
        prompt = sample_prompt(function, tokenizer)
        if prompt is None:
            return
        try:
            function.label_ids(tokenizer, prompt)
        except LabelError as e:
            raise LabelError(
                f"prefillonly serve --app: {function.path} ({function.fn.__qualname__}) "
                f"cannot be served by this model: {e}"
            ) from None

    return check_tokenizer


class _NoSample(Exception):
    pass


def sample_prompt(function, tokenizer):
    """The function's prompt for sample arguments, or None (logged) if it cannot be made."""
    try:
        arguments = {}
        for p in inspect.signature(function.fn).parameters.values():
            if p.default is not p.empty:
                arguments[p.name] = p.default
            else:
                arguments[p.name] = sample_value(function.inputs.hints.get(p.name, Any))
        if function.kind == "ranker":
            arguments[function.item_param] = sample_value(function.item_type)
        value = function.fn(**arguments)
    except Exception as e:  # _NoSample, or the function refused the sample arguments
        logger.warning(
            "%s: labels not checked at start-up (no sample call: %s); a label that is not "
            "one token gets a 400 at the first request",
            function.path,
            e or type(e).__name__,
        )
        return None
    return function.as_prompt(value, tokenizer)  # chat errors stop the start-up


def sample_value(annotation):
    """A plausible value of a type, for building a sample prompt."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in (str, Any, object):
        return "example"
    if annotation in (bool, int, float):
        return annotation(0)
    if origin is typing.Literal:
        return args[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(iter(annotation))
    if origin is typing.Annotated:
        return sample_value(args[0])
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is not type(None):
                try:
                    return sample_value(arg)
                except _NoSample:
                    pass
        return None
    container = origin or annotation
    if container in (list, tuple, set, frozenset, dict):
        return container()
    raise _NoSample(f"no sample value of {annotation!r}")
