"""`prefillonly serve` on SGLang's own HTTP server.

SGLang's server is a module-level FastAPI `app` (sglang.srt.entrypoints.http_server) run
by uvicorn in the main process, with the scheduler and detokenizer in spawned processes.
Before it starts we add to that same app, so every SGLang endpoint and client keeps
working:
- the RequestGuard middleware (prefillonly_sgl/server/guard.py) on the work endpoints;
- /v1/chat/completions and /v1/completions routes on SGLang's handlers, which run a
  single-token request as a prefill-only request (sglang_runtime/single_token.py);
- a /v1/score route that calls SGLang's handler and adds cached tokens and queue/running
  time to the response's `usage` (the body was checked by the guard with ScoringFront's
  checks, score_front.py, the same the Engine and the typed endpoints use);
- a RequestValidationError handler with short messages (SGLang's own embeds a traceback
  line), except on the paths whose error format SGLang documents;
- the typed endpoints of the EndpointSpecs it is given (`--app`, and the built-in APIs of
  prefillonly_sgl/apis/: /v1/score_labels, /v1/rerank, /v1/classify), which score through
  ScoringFront;
- a lifespan wrapper that, once SGLang is up, starts the ScoringFront (which records usage
  and rids from the tokenizer manager's generate_request), arms SGLang's SIGTERM drain at
  once, aborts what is still running --shutdown-timeout seconds after SIGTERM, and runs
  the endpoints' on_startup.
Then sglang.launch_server.run_server runs the server exactly as `sglang serve` would.
"""

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os

import orjson

from prefillonly_sgl.errors import InvalidRequestError
from prefillonly_sgl.score_result import ScoreResult
from prefillonly_sgl.server.admission import AdmissionControl
from prefillonly_sgl.server.body_encoding import DecodeRequestBody
from prefillonly_sgl.server.endpoints import EndpointSpec, check_unique_paths
from prefillonly_sgl.server.errors import error_body
from prefillonly_sgl.server.guard import (
    GuardMetrics,
    GuardPolicy,
    InFlightRequests,
    RequestGuard,
)
from prefillonly_sgl.server.options import ServeOptions
from prefillonly_sgl.server.route_checks import CheckContext, check_request, route_checks
from prefillonly_sgl.sglang_runtime.score_front import ScoringFront
from prefillonly_sgl.usage import CURRENT_REQUEST, RequestRecord
from prefillonly_sgl.validation import ModelLimits

logger = logging.getLogger(__name__)

# SGLang endpoints that run the model: guarded (checked, admitted, drained on shutdown).
WORK_PATHS = {
    "/generate",
    "/v1/score",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/encode",
    "/classify",
    "/v1/classify",
    "/v1/rerank",
    "/v1/decisions",
    "/v1/responses",
    "/v1/messages",
    "/v1/systemone",
    "/invocations",
    "/api/generate",
    "/api/chat",
}
# Paths whose validation-error format SGLang documents per API: left to SGLang's handler.
_OWN_ERROR_FORMAT_PREFIXES = ("/v1/messages", "/v1/responses", "/v1/systemone")


def _tokenizer_manager():
    from sglang.srt.entrypoints.http_server import get_global_state

    state = get_global_state()
    if state is None:
        raise RuntimeError("SGLang's server is not initialised yet")
    return state.tokenizer_manager


class SGLangRuntime:
    """The GuardRuntime of SGLang's server, and what endpoint contexts are built on."""

    def __init__(self, options: ServeOptions, app_specs: list[EndpointSpec]) -> None:
        self.options = options
        self._checks = route_checks(app_specs)
        self._front: ScoringFront | None = None
        # One context for the server's lifetime: what handlers keep per server (the DSL's
        # backend and its calibration priors, dsl/backends/server.server_backend) hangs off it.
        self.context = ServerContext(self)

    @property
    def tokenizer_manager(self):
        return _tokenizer_manager()

    def start(self) -> ScoringFront:
        """Starts the server's scoring path, once SGLang's scheduler has reported its
        limits (the lifespan calls it before the first request)."""
        if self._front is None:
            from sglang.srt.entrypoints.http_server import get_global_state

            from prefillonly_sgl.sglang_runtime.model_limits import limits_from_scheduler_info

            tm = self.tokenizer_manager
            limits = limits_from_scheduler_info(
                get_global_state().scheduler_info, tm.model_config.vocab_size
            )
            self._front = ScoringFront(tm, limits)
        return self._front

    @property
    def front(self) -> ScoringFront:
        return self._front or self.start()

    @property
    def limits(self) -> ModelLimits:
        return self.front.limits

    # -- GuardRuntime --
    def shutting_down(self) -> bool:
        return bool(self.tokenizer_manager.gracefully_exit)

    def check(self, path: str, body: object) -> int:
        """The path's check from the one table (server/route_checks.py)."""
        context = CheckContext(
            limits=self.limits,
            count_prompt_tokens=self.front.count_prompt_tokens,
            max_prompts=self.options.max_pending_prompts,
            labels_required=self.tokenizer_manager.is_generation,
        )
        return check_request(self._checks, path, body, context)

    def abort(self, record: RequestRecord) -> None:
        tm = self.tokenizer_manager
        for obj in record.sglang_requests:
            rids = obj.rid if isinstance(obj.rid, list) else [obj.rid]
            for rid in rids:
                if rid:
                    tm.abort_request(rid)


# The HTTP request a handler is answering (its disconnect aborts the scoring it started),
# set per request by _add_endpoint; the context itself is one per runtime.
_RAW_REQUEST: contextvars.ContextVar = contextvars.ContextVar("raw_request", default=None)


class ServerContext:
    """What an EndpointSpec handler gets (protocol: server/endpoints.ServerContext): one
    per runtime, the request being answered read from _RAW_REQUEST."""

    def __init__(self, runtime: SGLangRuntime) -> None:
        self._runtime = runtime

    @property
    def tokenizer_manager(self):
        return self._runtime.tokenizer_manager

    @property
    def tokenizer(self):
        return self._runtime.tokenizer_manager.tokenizer

    @property
    def limits(self) -> ModelLimits:
        return self._runtime.limits

    @property
    def usage(self):
        record = CURRENT_REQUEST.get()
        return record.usage if record is not None else None

    async def score(
        self,
        query,
        items,
        label_token_ids,
        apply_softmax=True,
        item_first=False,
        length_normalize=False,
    ) -> ScoreResult:
        """prefillonly_sgl.Engine.score semantics, on the server's engine (the same
        ScoringFront, so the same checks, result and cached_tokens)."""
        return await self._runtime.front.score(
            query,
            items,
            label_token_ids,
            apply_softmax,
            item_first,
            _RAW_REQUEST.get(),
            length_normalize,
        )

    async def continuation_logprobs(self, query, items, continuation):
        """prefillonly_sgl.Engine.continuation_logprobs semantics, on the server's engine."""
        return await self._runtime.front.continuation_logprobs(
            query, items, continuation, _RAW_REQUEST.get()
        )

    async def decide(self, call):
        """A decisions.call.DecisionCall answered on the server's engine (Engine.decide's
        path: the state computed once, each question an item)."""
        return await self._runtime.front.decide(call, _RAW_REQUEST.get())


def _json_response(content, status: int = 200):
    from fastapi.responses import Response

    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def _error_response(status: int, message: str, shape: str = "sglang"):
    from fastapi.responses import Response

    body = error_body(status, message, shape)
    return Response(body, status_code=status, media_type="application/json")


def _validation_message(errors) -> str:
    parts = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg"))
    text = "; ".join(p for p in parts if p) or "invalid request"
    return text if len(text) <= 1000 else text[:1000] + "..."


def _install_validation_handler(app) -> None:
    from fastapi.exceptions import RequestValidationError

    sglang_handler = app.exception_handlers.get(RequestValidationError)

    async def handler(request, exc):
        if sglang_handler is not None and request.url.path.startswith(_OWN_ERROR_FORMAT_PREFIXES):
            return await sglang_handler(request, exc)
        return _error_response(400, f"invalid request: {_validation_message(exc.errors())}")

    app.exception_handlers[RequestValidationError] = handler


def _replace_score_route(app) -> None:
    """/v1/score: SGLang's handler, then this request's usage merged into `usage`."""
    from fastapi import Depends, Request
    from fastapi.routing import APIRoute
    from sglang.srt.entrypoints.http_server import validate_json_request
    from sglang.srt.entrypoints.openai.protocol import ScoringRequest

    stock = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == "/v1/score"]
    if len(stock) != 1:
        raise RuntimeError(f"expected one SGLang /v1/score route, found {len(stock)}")

    async def v1_score_request(request: ScoringRequest, raw_request: Request):
        response = await raw_request.app.state.openai_serving_score.handle_request(
            request, raw_request
        )
        record = CURRENT_REQUEST.get()
        if record is None or not record.usage.prompts or response.status_code != 200:
            return response
        content = orjson.loads(response.body)
        content["usage"] = {**(content.get("usage") or {}), **record.usage.score_usage()}
        return _json_response(content)

    v1_score_request.__doc__ = stock[0].endpoint.__doc__
    app.router.routes.remove(stock[0])
    app.add_api_route(
        "/v1/score",
        v1_score_request,
        methods=["POST"],
        dependencies=[Depends(validate_json_request)],
    )


def _add_endpoint(app, spec: EndpointSpec, runtime: SGLangRuntime) -> None:
    from fastapi import Request

    if spec.raw_body:
        _add_raw_endpoint(app, spec, runtime)
        return

    async def endpoint(body, raw_request):
        token = _RAW_REQUEST.set(raw_request)
        try:
            result = spec.handler(body, runtime.context)
            return await result if inspect.isawaitable(result) else result
        except InvalidRequestError as e:
            return _error_response(400, str(e), spec.error_shape)
        finally:
            _RAW_REQUEST.reset(token)

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
        endpoint,
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
    from pydantic import BaseModel

    async def endpoint(raw_request: Request):
        token = _RAW_REQUEST.set(raw_request)
        try:
            try:
                body = orjson.loads(await raw_request.body())
            except orjson.JSONDecodeError as e:
                return _error_response(400, f"the body is not valid JSON: {e}", spec.error_shape)
            result = spec.handler(body, runtime.context)
            result = await result if inspect.isawaitable(result) else result
            if isinstance(result, BaseModel):
                result = result.model_dump(mode="json")
            return _json_response(result)
        except InvalidRequestError as e:
            return _error_response(400, str(e), spec.error_shape)
        finally:
            _RAW_REQUEST.reset(token)

    schema = spec.request_model.model_json_schema(ref_template="#/components/schemas/{model}")
    app.add_api_route(
        spec.path,
        endpoint,
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


def _inline_defs(schema: dict) -> dict:
    """A pydantic JSON schema whose $defs stay inside it (openapi_extra cannot add
    components): references rewritten to the local $defs."""
    text = orjson.dumps(schema).decode().replace("#/components/schemas/", "#/$defs/")
    return orjson.loads(text)


def _replace_models_route(app) -> None:
    """GET /v1/models: SGLang's list (OpenAI's `data`), plus System One's `models`
    ({name, description, release_date}), which typesafe-sdk's `models.list()` reads; each
    client ignores the other's key."""
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
        content["models"] = [system_one_model(card) for card in content.get("data", [])]
        return _json_response(content)

    available_models.__doc__ = stock_endpoint.__doc__
    app.router.routes.remove(stock[0])
    app.add_api_route("/v1/models", available_models, methods=["GET"])


def system_one_model(card: dict) -> dict:
    """A model card as System One lists it: the release date is the day the model's card
    was created (its `created` time), as no release date is known for a local folder."""
    import datetime

    created = card.get("created") or 0
    day = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).date().isoformat()
    return {
        "name": card.get("id"),
        "description": f"{card.get('id')} served by prefillonly-sgl: prefill-only decisions",
        "release_date": day,
    }


async def _abort_when_drain_times_out(tm, timeout: float, in_flight: InFlightRequests) -> None:
    """SGLang drains in-flight requests on SIGTERM and waits for them without limit; after
    `timeout` seconds we stop the rest: guarded requests get a 503 naming the reason, and
    anything else left in SGLang is aborted, so the server exits."""
    while not tm.gracefully_exit:
        await asyncio.sleep(0.5)
    logger.warning(
        "SIGTERM: refusing new requests, %d prompts in flight get %.0f s to finish",
        len(tm.rid_to_state),
        timeout,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while tm.rid_to_state and loop.time() < deadline:
        await asyncio.sleep(0.2)
    if tm.rid_to_state:
        logger.warning("SIGTERM: aborting %d prompts still running", len(tm.rid_to_state))
        in_flight.stop_all(
            f"server shut down before this request finished (it had {timeout:g} s after "
            "SIGTERM, --shutdown-timeout); retry on another replica"
        )
        await asyncio.sleep(1)
        if tm.rid_to_state:  # work that did not come through the guard
            tm.abort_request(abort_all=True)


def _wrap_lifespan(
    app, runtime: SGLangRuntime, specs: list[EndpointSpec], in_flight: InFlightRequests
) -> None:
    sglang_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(fast_api_app):
        async with sglang_lifespan(fast_api_app) as state:
            tm = runtime.tokenizer_manager
            runtime.start()  # also starts recording usage and rids
            # SGLang arms its SIGTERM drain (tokenizer_manager.SignalHandler) on the first
            # request; arm it now so a SIGTERM before any request drains the same way.
            tm.auto_create_handle_loop()
            watchdog = asyncio.create_task(
                _abort_when_drain_times_out(tm, runtime.options.shutdown_timeout, in_flight)
            )
            for spec in specs:
                if spec.on_startup is not None:
                    result = spec.on_startup(runtime.context)
                    if inspect.isawaitable(result):
                        await result
            try:
                yield state
            finally:
                watchdog.cancel()

    app.router.lifespan_context = lifespan


def _guard_metrics(enabled: bool):
    if not enabled:
        return GuardMetrics
    from prefillonly_sgl.server.metrics import PrometheusGuardMetrics

    return PrometheusGuardMetrics


REPLACED_PATHS = frozenset({"/v1/rerank", "/v1/classify", "/v1/decisions", "/v1/systemone"})


def install(
    app,
    options: ServeOptions,
    specs: list[EndpointSpec],
    enable_metrics: bool,
    mark_reusable_prefixes: bool = True,
):
    """Adds everything `serve` adds to SGLang's FastAPI app (before it starts); ``specs``:
    every typed endpoint, the `--app` ones and the built-in APIs (prefillonly_sgl/apis/),
    which the caller builds. mark_reusable_prefixes: single-token OpenAI requests carry
    their reusable prefix (when a runtime feature reads it)."""
    from fastapi.routing import APIRoute

    from prefillonly_sgl.sglang_runtime import single_token, tokenizer_endpoints

    # SGLang's /v1/rerank and /v1/classify serve cross-encoder / classification models
    # only, and its /v1/decisions and /v1/systemone score each question's whole prompt
    # outside the prefix-sharing path: ours (apis/, among `specs`) replace them.
    ours = {spec.path for spec in specs}
    app.router.routes[:] = [
        r
        for r in app.router.routes
        if not (isinstance(r, APIRoute) and r.path in REPLACED_PATHS and r.path in ours)
    ]
    taken = {r.path for r in app.router.routes if isinstance(r, APIRoute)}
    check_unique_paths(specs, taken)
    runtime = SGLangRuntime(options, specs)
    _install_validation_handler(app)
    _replace_score_route(app)
    _replace_models_route(app)
    single_token.install_routes(app)
    single_token.install_in_this_process(mark_reusable_prefixes)
    tokenizer_endpoints.install(app, lambda: runtime.tokenizer_manager)
    for spec in specs:
        _add_endpoint(app, spec, runtime)
    error_shapes = {spec.path: spec.error_shape for spec in specs if spec.error_shape != "sglang"}
    policy = GuardPolicy(
        guarded_paths=WORK_PATHS | {spec.path for spec in specs},
        max_request_bytes=options.max_request_bytes,
        admission=AdmissionControl(options.max_pending_requests, options.max_pending_prompts),
        error_shapes=error_shapes,
    )
    app.add_middleware(
        RequestGuard, policy=policy, runtime=runtime, metrics=_guard_metrics(enable_metrics)
    )
    # Added last, so it runs first: the guard sees decoded bodies.
    app.add_middleware(
        DecodeRequestBody, max_request_bytes=options.max_request_bytes, error_shapes=error_shapes
    )
    _wrap_lifespan(app, runtime, specs, policy.in_flight)
    return runtime


def serve(
    sglang_argv: list[str],
    options: ServeOptions,
    specs: list[EndpointSpec],
    mark_reusable_prefixes: bool = True,
) -> int:
    """Parses sglang_argv with SGLang's own parser and runs SGLang's server with our
    additions and the typed endpoints ``specs`` (all of them: cli.py adds the built-in
    APIs to the `--app` ones). Blocks until the server exits."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()  # as `sglang serve` does; the runtime configuration is already set
    server_args = prepare_server_args(sglang_argv)
    if server_args.tokenizer_worker_num != 1:
        raise SystemExit(
            "prefillonly serve: --tokenizer-worker-num > 1 is not supported (the request "
            "checks run in the main process's HTTP server)"
        )
    from sglang.launch_server import run_server
    from sglang.srt.entrypoints.http_server import app

    install(
        app,
        options,
        specs,
        enable_metrics=bool(server_args.enable_metrics),
        mark_reusable_prefixes=mark_reusable_prefixes,
    )
    if server_args.device == "cpu":
        from prefillonly_sgl.sglang_runtime.offline_engine import _check_cpu_support

        _check_cpu_support()
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0
