"""The pydantic models of a DSL function's typed endpoints (plain Python), shared by the
server side (endpoint.py) and the client side (app_client.py, used by RemoteBackend).

Request models come from the function's signature (extra fields are refused), response
models are the DSL's result models, so the label type is an enum in /openapi.json. A
request (a batch: at its top, not per input) also takes `cache_salt` (wire/fields.py),
unless the function has a parameter of that name. Each
request model carries ``x-prefillonly-dsl`` (kind, function, labels) in its JSON schema:
how a client recognises the endpoint of *its* function.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, create_model

from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.wire.fields import cache_salt_field

MARKER = "x-prefillonly-dsl"  # JSON-schema key of a DSL endpoint's request model


@dataclass(frozen=True)
class AppModels:
    """The pydantic models of one function's endpoints (built once, see app_models)."""

    marker: dict  # {"kind", "function", "labels"}: what a client checks before calling
    request: type[BaseModel]  # POST path
    response: type[BaseModel]
    batch_request: type[BaseModel] | None = None  # classifiers: POST path/batch
    batch_response: type[BaseModel] | None = None
    batch_input: type[BaseModel] | None = None  # one input of a batch (no cache_salt)


def app_models(function) -> AppModels:
    models = function.__dict__.get("_app_models")
    if models is None:
        models = _build_models(function)
        function._app_models = models
    return models


def _build_models(function) -> AppModels:
    name = function.fn.__name__
    marker = {"kind": function.kind, "function": name, "labels": list(function.labels.texts)}
    if function.kind == "ranker":
        marker["method"] = function.method
    config = ConfigDict(
        extra="forbid", arbitrary_types_allowed=True, json_schema_extra={MARKER: marker}
    )
    fields = {n: (f.annotation, f) for n, f in function.inputs.model.model_fields.items()}
    # A parameter of the function named cache_salt keeps its meaning: no salt field then.
    salted = {} if "cache_salt" in fields else {"cache_salt": (str | None, cache_salt_field())}
    if function.kind == "ranker":
        if function.scores_continuation:
            score = typing.Literal["mean", "sum"] | None
            score_help = "sort by the continuation's mean (default) or sum log-probability"
        else:
            texts = typing.Literal[function.labels.texts]
            score = texts | dict[texts, float] | None
            score_help = "sort by this label, or by {label: weight} sums"
        fields |= {
            "items": (
                list[function.item_type],
                Field(..., min_length=1, description=f"values of {function.item_param}"),
            ),
            "top_k": (int | None, Field(None, ge=1, description="how many best items")),
            "score": (score, Field(None, description=score_help)),
        }
        request = create_model(f"{name}Request", __config__=config, **fields, **salted)
        models = AppModels(marker, request, function.result_model)
    else:
        request = create_model(f"{name}Input", __config__=config, **fields, **salted)
        one_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
        one = create_model(f"{name}BatchInput", __config__=one_config, **fields)
        batch = create_model(
            f"{name}BatchRequest",
            __config__=ConfigDict(extra="forbid", json_schema_extra={MARKER: marker}),
            inputs=(list[one], Field(..., min_length=1)),
            **salted,
        )
        results = create_model(f"{name}BatchResult", results=(list[function.result_model], ...))
        models = AppModels(marker, request, function.result_model, batch, results, one)
    for model in (
        models.request,
        models.response,
        models.batch_request,
        models.batch_response,
        models.batch_input,
    ):
        try:
            if model is not None:
                model.model_json_schema()
        except Exception as e:  # an argument type with no JSON form
            raise DeclarationError(
                f"{function.fn.__qualname__}: cannot be served over HTTP, {model.__name__} "
                f"has no JSON schema: {e}"
            ) from None
    return models
