"""What serve adds to SGLang's FastAPI app as routes: /v1/score (SGLang's handler, its usage
extended), /v1/models (System One's list beside OpenAI's), the typed endpoints of the
EndpointSpecs (validated by their models, or parsing their own bodies), the JSON answers
and errors, and a validation-error handler with short messages."""

import inspect

import orjson
from pydantic import BaseModel

from prefillonly_sgl.decisions.checkpoints import LM_HEAD, Readout
from prefillonly_sgl.scoring.call_context import CallContext, carrying, current
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.auth import NORMAL
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.error_bodies import error_body, validation_message
from prefillonly_sgl.sglang_runtime.http_server.access import declare
from prefillonly_sgl.sglang_runtime.http_server.runtime import SGLangRuntime
from prefillonly_sgl.sglang_runtime.http_server.score_images import (
    carries_images,
    score_with_images,
)
from prefillonly_sgl.wire.prefillonly import score_usage

# Paths whose validation-error format SGLang documents per API: left to SGLang's handler.
_OWN_ERROR_FORMAT_PREFIXES = ("/v1/messages", "/v1/responses", "/v1/systemone")


def _json_response(content, status: int = 200):
    from fastapi.responses import Response

    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _error_response(status: int, message: str, shape: str = "sglang"):
    from fastapi.responses import Response

    body = error_body(status, message, shape)
    return Response(body, status_code=status, media_type="application/json")


def _install_validation_handler(app) -> None:
    from fastapi.exceptions import RequestValidationError

    sglang_handler = app.exception_handlers.get(RequestValidationError)

    async def handler(request, exc):
        if sglang_handler is not None and request.url.path.startswith(_OWN_ERROR_FORMAT_PREFIXES):
            return await sglang_handler(request, exc)
        return _error_response(400, f"invalid request: {validation_message(exc.errors())}")

    app.exception_handlers[RequestValidationError] = handler


async def _score_images(runtime: SGLangRuntime, body: dict, raw_request):
    """/v1/score with images (score_images.py), its usage merged as SGLang's route's."""
    try:
        ctx = _route_context(body, raw_request)
        with carrying(ctx):
            served = runtime.tokenizer_manager.served_model_name
            content = await score_with_images(runtime.front, ctx, body, served)
    except InvalidRequestError as e:
        return _error_response(400, str(e))
    record = ctx.record
    if record is not None and record.usage.prompts:
        content["usage"] = {**content["usage"], **score_usage(record.usage)}
    return _json_response(content)


def _replace_score_route(app, runtime: SGLangRuntime, peers: list[EndpointSpec] = ()) -> None:
    """/v1/score: SGLang's handler, then this request's usage merged into `usage`; a body
    one of ``peers`` claims (EndpointSpec.claims: vLLM's score shapes) goes to that spec
    instead. The body is read here (not by FastAPI) so its shape can decide; SGLang's
    ScoringRequest then validates it as FastAPI would (same errors)."""
    from fastapi import Depends, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.routing import APIRoute
    from pydantic import ValidationError
    from sglang.srt.entrypoints.http_server import validate_json_request
    from sglang.srt.entrypoints.openai.protocol import ScoringRequest

    stock = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/v1/score"]
    if len(stock) != 1:
        raise RuntimeError(f"expected one SGLang /v1/score route, found {len(stock)}")

    async def v1_score_request(raw_request: Request):
        try:
            body = orjson.loads(await raw_request.body())
        except orjson.JSONDecodeError as e:
            return _error_response(400, f"the body is not valid JSON: {e}")
        for peer in peers:
            if peer.claims(body):
                return await _run_raw(peer, runtime, body, raw_request)
        if carries_images(body):  # our extension: SGLang's handler would drop them
            return await _score_images(runtime, body, raw_request)
        try:
            request = ScoringRequest.model_validate(body)
        except ValidationError as e:
            raise RequestValidationError(e.errors(), body=body) from None
        try:
            ctx = _route_context(body, raw_request)  # ours: SGLang's ScoringRequest has no salt
        except InvalidRequestError as e:
            return _error_response(400, str(e))
        with carrying(ctx):  # SGLang's handler, then its requests (request_recording.py)
            response = await raw_request.app.state.openai_serving_score.handle_request(
                request, raw_request
            )
        record = ctx.record
        if record is None or not record.usage.prompts or response.status_code != 200:
            return response
        content = orjson.loads(response.body)
        content["usage"] = {**(content.get("usage") or {}), **score_usage(record.usage)}
        return _json_response(content)

    v1_score_request.__doc__ = stock[0].endpoint.__doc__
    app.router.routes.remove(stock[0])
    schema = ScoringRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    app.add_api_route(
        "/v1/score",
        declare(v1_score_request, NORMAL),  # as SGLang's /v1/score
        methods=["POST"],
        dependencies=[Depends(validate_json_request)],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _inline_defs(schema)}},
            }
        },
    )


def _add_endpoint(app, spec: EndpointSpec, runtime: SGLangRuntime) -> None:
    from fastapi import Request

    if spec.raw_body:
        _add_raw_endpoint(app, spec, runtime)
        return

    async def endpoint(body, raw_request):
        try:
            # the handler (a DSL function, an API's) reaches the front through
            # runtime.context, which reads this context (ServerContext.call)
            with carrying(_route_context(body, raw_request)):
                result = spec.handler(body, runtime.context)
                return await result if inspect.isawaitable(result) else result
        except InvalidRequestError as e:
            return _error_response(400, str(e), spec.error_shape)

    # FastAPI reads the body model from the signature: give it the spec's types.
    endpoint.__signature__ = inspect.Signature(
        [
            inspect.Parameter(
                "body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=spec.request_model
            ),
            inspect.Parameter(
                "raw_request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
        ]
    )
    app.add_api_route(
        spec.path,
        declare(endpoint, spec.auth_level),
        methods=["POST"],
        response_model=spec.response_model,
        summary=spec.summary,
        description=spec.description or inspect.getdoc(spec.handler),
        tags=list(spec.tags),
        name=spec.path.strip("/").replace("/", "_") or "root",
    )


def _add_raw_endpoint(app, spec: EndpointSpec, runtime: SGLangRuntime) -> None:
    """A route whose handler parses the JSON body itself (EndpointSpec.raw_body): the
    request model documents it in /openapi.json; the answer goes out as returned."""
    from fastapi import Request

    async def endpoint(raw_request: Request):
        try:
            body = orjson.loads(await raw_request.body())
        except orjson.JSONDecodeError as e:
            return _error_response(400, f"the body is not valid JSON: {e}", spec.error_shape)
        return await _run_raw(spec, runtime, body, raw_request)

    schema = spec.request_model.model_json_schema(ref_template="#/components/schemas/{model}")
    app.add_api_route(
        spec.path,
        declare(endpoint, spec.auth_level),
        methods=["POST"],
        summary=spec.summary,
        description=spec.description or inspect.getdoc(spec.handler),
        tags=list(spec.tags),
        name=spec.path.strip("/").replace("/", "_") or "root",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _inline_defs(schema)}},
            }
        },
    )


async def _run_raw(spec: EndpointSpec, runtime: SGLangRuntime, body, raw_request):
    """A raw_body spec's handler on the parsed body: its answer as JSON (or as the
    Response it made), its refusals in the spec's error shape."""
    from starlette.responses import Response

    try:
        with carrying(_route_context(body, raw_request)):
            result = spec.handler(body, runtime.context)
            result = await result if inspect.isawaitable(result) else result
        if isinstance(result, Response):  # SGLang's own handler's answer, as it made it
            return result
        if isinstance(result, BaseModel):
            result = result.model_dump(mode="json")
        return _json_response(result)
    except InvalidRequestError as e:
        return _error_response(400, str(e), spec.error_shape)


def _route_context(body, raw_request) -> CallContext:
    """The route's call context: the request's (the guard's: tenant, adapter, record) with
    the body's `cache_salt` (every scoring route's wire model declares it; checked: an
    InvalidRequestError naming a bad one) and the HTTP request, which the whole request
    then runs under (scoring/call_context.py): the handlers need not pass the salt on, and
    none can forget to."""
    salt = body.get("cache_salt") if isinstance(body, dict) else getattr(body, "cache_salt", None)
    return current().entering(salt=salt).replace(http_request=raw_request)


def _inline_defs(schema: dict) -> dict:
    """A pydantic JSON schema whose $defs stay inside it (openapi_extra cannot add
    components): references rewritten to the local $defs."""
    text = orjson.dumps(schema).decode().replace("#/components/schemas/", "#/$defs/")
    return orjson.loads(text)


def _replace_models_route(app, runtime: SGLangRuntime) -> None:
    """GET /v1/models: SGLang's list (OpenAI's `data`), plus System One's `models`
    ({name, description, release_date}), which typesafe-sdk's `models.list()` reads; each
    client ignores the other's key. Every card of both says how the model answers
    decisions (`readout`: decisions/checkpoints.py)."""
    from fastapi.routing import APIRoute

    stock = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/v1/models"]
    if len(stock) != 1:
        raise RuntimeError(f"expected one SGLang /v1/models route, found {len(stock)}")
    stock_endpoint = stock[0].endpoint

    async def available_models():
        listed = await stock_endpoint()
        content = (
            listed.model_dump() if hasattr(listed, "model_dump") else orjson.loads(listed.body)
        )
        readout = runtime.front.readout
        for card in content.get("data", []):
            card["readout"] = readout.kind
        content["models"] = [
            {**system_one_model(card, readout), "readout": readout.kind}
            for card in content.get("data", [])
        ]
        return _json_response(content)

    available_models.__doc__ = stock_endpoint.__doc__
    app.router.routes.remove(stock[0])
    # As SGLang's /v1/models: what the API key may call.
    app.add_api_route("/v1/models", declare(available_models, NORMAL), methods=["GET"])


def system_one_model(card: dict, readout: Readout = LM_HEAD) -> dict:
    """A model card as System One lists it: the release date is the day the model's card
    was created (its `created` time), as no release date is known for a local folder."""
    import datetime

    created = card.get("created") or 0
    day = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).date().isoformat()
    how = (
        f"a decision checkpoint answering with its {readout.kind.replace('_', ' ')}"
        if readout.is_checkpoint
        else "prefill-only decisions"
    )
    return {
        "name": card.get("id"),
        "description": f"{card.get('id')} served by prefillonly-sgl: {how}",
        "release_date": day,
    }
