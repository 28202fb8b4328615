"""Calling a DSL function through its typed endpoint on a `prefillonly serve --app` server.

A call whose backend is a RemoteBackend first asks whether the server serves *this*
function: its /openapi.json (read once per backend) lists ``POST <function.path>`` and the
request schema's ``x-prefillonly-dsl`` marker has the same kind, function name and labels,
with the same fields. Then the validated arguments go there as JSON and the server builds
the prompt and compiles the labels with its own tokenizer, so the client needs no
tokenizer. Otherwise the call compiles here and posts /v1/score, as before.
Results are rebuilt here from the returned label probabilities, exactly as after a
/v1/score call (same result types, Enum labels included).
"""

from __future__ import annotations

import asyncio

from prefillonly_sgl.dsl.endpoint import MARKER, app_models


def served_by(function, backend) -> bool:
    """Whether ``backend`` is a server exposing this function's typed endpoint."""
    schema_of = getattr(backend, "endpoint_schema", None)
    if schema_of is None:
        return False
    schema = schema_of(function.path)
    if not schema:
        return False
    models = app_models(function)
    fields = set(schema.get("properties") or {})
    return schema.get(MARKER) == models.marker and fields == set(models.request.model_fields)


async def aserved_by(function, backend) -> bool:
    """``served_by`` for async calls (the first one reads /openapi.json in a thread)."""
    if getattr(backend, "endpoint_schema", None) is None:
        return False
    return await asyncio.to_thread(served_by, function, backend)


def _rows(function, results: list[dict]) -> list[list[float]]:
    """Probability rows (label order) from result objects' ``probs``."""
    return [[result["probs"][t] for t in function.labels.texts] for result in results]


def classify_one(function, backend, arguments: dict) -> list[float]:
    body = app_models(function).request.model_validate(arguments).model_dump(mode="json")
    return _rows(function, [backend.post(function.path, body)])[0]


def _classify_chunk(function, backend, chunk: list[dict]) -> list[list[float]]:
    request = app_models(function).request
    body = {"inputs": [request.model_validate(a).model_dump(mode="json") for a in chunk]}
    return _rows(function, backend.post(f"{function.path}/batch", body)["results"])


def _chunks(arguments: list[dict], size: int) -> list[list[dict]]:
    return [arguments[start : start + size] for start in range(0, len(arguments), size)]


def classify_many(function, backend, arguments, batch_size: int, bar=None) -> list[list[float]]:
    """``batch_size`` inputs per request to ``<path>/batch``, in order."""
    rows = []
    for chunk in _chunks(arguments, batch_size):
        rows += _classify_chunk(function, backend, chunk)
        if bar is not None:
            bar.update(len(chunk))
    return rows


async def aclassify_many(
    function, backend, arguments, batch_size: int, bar, max_in_flight: int
) -> list[list[float]]:
    gate = asyncio.Semaphore(max_in_flight)

    async def run(chunk):
        async with gate:
            rows = await asyncio.to_thread(_classify_chunk, function, backend, chunk)
        if bar is not None:
            bar.update(len(chunk))
        return rows

    done = await asyncio.gather(*(run(c) for c in _chunks(arguments, batch_size)))
    return [row for rows in done for row in rows]


def rank(function, backend, shared: dict, items: list) -> list[list[float]]:
    """Probability rows of every item, in item order (top_k and score are applied here)."""
    request = app_models(function).request.model_validate({**shared, "items": items})
    body = request.model_dump(mode="json", exclude={"top_k", "score"})
    return _rows(function, backend.post(function.path, body)["by_input"])
