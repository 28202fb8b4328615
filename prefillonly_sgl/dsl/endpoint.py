"""DSL functions as typed HTTP endpoints: what ``prefillonly serve --app FILE`` exposes for
each classifier and ranker declared in FILE (plain Python; SGLang stays on the server side).

    POST /apps/<name>          classifier: the function's arguments -> <name>Result
    POST /apps/<name>/batch    classifier: {"inputs": [arguments, ...]} -> {"results": [...]}
    POST /apps/<name>          ranker: shared arguments + "items" (+ "top_k", "score")
                               -> <name>Ranking

(``path=`` on the decorator replaces /apps/<name>.) Request models come from the
function's signature (extra fields are refused), response models are the DSL's result
models, so the label type is an enum in /openapi.json. The handler compiles the call with
the server's tokenizer and scores through ``context.score`` (the checks of /v1/score),
warm-up requests first as in a local call.

Labels are checked once at server start-up (``on_startup``): the function is called with
sample arguments (defaults, else "example" / 0 / the first Literal value ...) and its
labels compiled after that prompt, so a label that is not one token stops the server with
a message naming it. When no sample call can be made the check is left to the requests,
which then get a 400 naming the label.

Each request model carries ``x-prefillonly-dsl`` (kind, function, labels) in its JSON
schema: how the remote backend recognises the endpoint of *its* function (app_client.py).
"""

from __future__ import annotations

import enum
import inspect
import logging
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from prefillonly_sgl.dsl.labels import LabelError
from prefillonly_sgl.dsl.runner import asend
from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.server.endpoints import EndpointSpec

logger = logging.getLogger(__name__)

MARKER = "x-prefillonly-dsl"  # JSON-schema key of a DSL endpoint's request model


@dataclass(frozen=True)
class AppModels:
    """The pydantic models of one function's endpoints (built once, see app_models)."""

    marker: dict  # {"kind", "function", "labels"}: what a client checks before calling
    request: type[BaseModel]  # POST path
    response: type[BaseModel]
    batch_request: type[BaseModel] | None = None  # classifiers: POST path/batch
    batch_response: type[BaseModel] | None = None


def app_models(function) -> AppModels:
    models = function.__dict__.get("_app_models")
    if models is None:
        models = _build_models(function)
        function._app_models = models
    return models


def _build_models(function) -> AppModels:
    from prefillonly_sgl.dsl.ranker import Ranker

    name = function.fn.__name__
    kind = "ranker" if isinstance(function, Ranker) else "classifier"
    marker = {"kind": kind, "function": name, "labels": list(function.labels.texts)}
    config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, json_schema_extra={MARKER: marker}
    )
    fields = {n: (f.annotation, f) for n, f in function.inputs.model.model_fields.items()}
    if kind == "ranker":
        texts = typing.Literal[function.labels.texts]
        fields |= {
            "items": (
                list[function.item_type],
                Field(..., min_length=1, description=f"values of {function.item_param}"),
            ),
            "top_k": (int | None, Field(None, ge=1, description="how many best items")),
            "score": (
                texts | dict[texts, float] | None,
                Field(None, description="sort by this label, or by {label: weight} sums"),
            ),
        }
        request = create_model(f"{name}Request", __config__=config, **fields)
        models = AppModels(marker, request, function.result_model)
    else:
        request = create_model(f"{name}Input", __config__=config, **fields)
        batch = create_model(
            f"{name}BatchRequest",
            __config__=ConfigDict(extra="forbid", json_schema_extra={MARKER: marker}),
            inputs=(list[request], Field(..., min_length=1)),
        )
        results = create_model(f"{name}BatchResult", results=(list[function.result_model], ...))
        models = AppModels(marker, request, function.result_model, batch, results)
    for model in (models.request, models.response, models.batch_request, models.batch_response):
        try:
            if model is not None:
                model.model_json_schema()
        except Exception as e:  # an argument type with no JSON form
            raise DeclarationError(
                f"{function.fn.__qualname__}: cannot be served over HTTP, {model.__name__} "
                f"has no JSON schema: {e}"
            ) from None
    return models


# -- the endpoints -----------------------------------------------------------------------------


class _ServerScorer:
    """The server context as a DSL backend (only ``ascore`` is needed by runner.asend)."""

    def __init__(self, context) -> None:
        self.context = context

    async def ascore(self, request) -> list[list[float]]:
        result = await self.context.score(
            request.query,
            list(request.items),
            list(request.label_token_ids),
            apply_softmax=request.apply_softmax,
        )
        return result.scores


def _arguments(function, body: BaseModel) -> dict:
    return {name: getattr(body, name) for name in function.inputs.params}


def classifier_endpoints(function) -> list[EndpointSpec]:
    models = app_models(function)
    name = function.fn.__qualname__
    labels = ", ".join(function.labels.texts)

    async def classify(body, context):
        compiled = function._compile(context.tokenizer, [_arguments(function, body)], None)
        answers = await asend(_ServerScorer(context), compiled)
        return function._classify_rows(compiled.gather(answers))[0]

    async def classify_batch(body, context):
        arguments = [_arguments(function, x) for x in body.inputs]
        compiled = function._compile(context.tokenizer, arguments, function.batch_size)
        answers = await asend(_ServerScorer(context), compiled)
        return models.batch_response(results=function._classify_rows(compiled.gather(answers)))

    check = _label_check(function)
    return [
        EndpointSpec(
            function.path,
            models.request,
            models.response,
            classify,
            summary=f"{name}: classify one input ({labels})",
            description=inspect.getdoc(function.fn),
            on_startup=check,
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
    from prefillonly_sgl.dsl.ranker import score_function

    models = app_models(function)

    async def rank(body, context):
        shared, items = _arguments(function, body), list(body.items)
        score_of = function.score_of
        if body.score is not None:
            score_of = score_function(function.labels, body.score)
        compiled = function._compile(context.tokenizer, shared, items)
        answers = await asend(_ServerScorer(context), compiled)
        return function._ranking(items, compiled.gather(answers), body.top_k, score_of)

    return EndpointSpec(
        function.path,
        models.request,
        models.response,
        rank,
        summary=f"{function.fn.__qualname__}: rank items, best first",
        description=inspect.getdoc(function.fn),
        count_prompts=lambda body: _count(body, "items"),
        on_startup=_label_check(function),
    )


def _count(body: dict, field: str) -> int:
    value = body.get(field)
    return len(value) if isinstance(value, list) else 1


# -- the start-up check of the labels ----------------------------------------------------------


def _label_check(function):
    def on_startup(context) -> None:
        prompt = sample_prompt(function, context.tokenizer)
        if prompt is None:
            return
        try:
            function.label_ids(context.tokenizer, prompt)
        except LabelError as e:
            raise LabelError(
                f"prefillonly serve --app: {function.path} ({function.fn.__qualname__}) "
                f"cannot be served by this model: {e}"
            ) from None

    return on_startup


class _NoSample(Exception):
    pass


def sample_prompt(function, tokenizer):
    """The function's prompt for sample arguments, or None (logged) if it cannot be made."""
    from prefillonly_sgl.dsl.ranker import Ranker

    try:
        arguments = {}
        for p in inspect.signature(function.fn).parameters.values():
            if p.default is not p.empty:
                arguments[p.name] = p.default
            else:
                arguments[p.name] = sample_value(function.inputs.hints.get(p.name, Any))
        if isinstance(function, Ranker):
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
