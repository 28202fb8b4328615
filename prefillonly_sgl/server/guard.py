"""RequestGuard: the ASGI middleware in front of every work endpoint (plain Python).

For each POST to a guarded path (the endpoints that run the model) it, in order:
1. answers 503 while the server drains for shutdown (SIGTERM);
2. reads the body, at most max_request_bytes (413 beyond), checks that it is UTF-8 JSON
   and runs the path's check (400 / 413 with a message naming the problem), then the
   runtime's authorize (403: a custom logit processor without the admin key); on a path
   of body_salt_paths (SGLang's embedding routes, whose request models have no such
   field) it takes the body's `cache_salt` off and runs the request under that salt
   (scoring/cache_salts.py), and on one of body_lora_paths (the scoring doors) its
   `lora_path`, under that adapter (scoring/adapters.py); on one of model_adapter_paths
   (vLLM's and OpenAI's doors) a `model` naming a loaded adapter runs under it;
3. admits it under AdmissionControl or answers 503 with Retry-After;
4. runs the endpoint under the request's context (scoring/call_context.py: the tenant the
   key check set, that salt and adapter, and a RequestRecord, through which the SGLang
   side records the request's rids and usage); the usage goes out as x-prefillonly-*
   response headers;
5. watches the connection: if the client goes away before the response is complete, the
   request's work is aborted in SGLang (runtime.abort) and the endpoint task cancelled,
   instead of SGLang noticing only every few seconds, and only for one prompt of a batch;
6. on policy.in_flight.stop_all() (shutdown timeout), aborts the work the same way and
   answers 503 with the reason.
Other paths (health, metrics, admin endpoints) pass through untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prefillonly_sgl.scoring.adapters import take_body_lora
from prefillonly_sgl.scoring.cache_salts import take_body_salt
from prefillonly_sgl.scoring.call_context import carrying, current
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.usage import RequestRecord, RequestUsage
from prefillonly_sgl.server.admission import AdmissionControl
from prefillonly_sgl.server.auth import RequestRefusedError
from prefillonly_sgl.server.error_bodies import send_json_error
from prefillonly_sgl.server.request_checks import RequestTooLargeError, parse_json_body

logger = logging.getLogger(__name__)


class GuardRuntime(Protocol):
    """The server the guard protects (SGLang's, in sglang_runtime/http_server/)."""

    def shutting_down(self) -> bool: ...

    def check(self, path: str, body: object) -> int:
        """Raises InvalidRequestError; returns the number of prompts."""
        ...

    # Optional: async authorize(scope, body) -> None, after check(); raises
    # InvalidRequestError or server.auth.RequestRefusedError (who sent it may not).

    def abort(self, record: RequestRecord) -> None: ...


class GuardMetrics:
    """No-op metrics; metrics.PrometheusGuardMetrics records them."""

    def pending(self, requests: int, prompts: int) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def finished(self, path: str, status: int, seconds: float, usage: RequestUsage) -> None:
        pass

    def disconnected(self) -> None:
        pass


class InFlightRequests:
    """Lets the shutdown path stop every guarded request still running: each gets a 503
    naming the reason, and its work is aborted in SGLang."""

    def __init__(self) -> None:
        self._stopped: asyncio.Future | None = None

    def _future(self) -> asyncio.Future:
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
        return self._stopped

    async def wait_for_stop(self) -> str:
        return await asyncio.shield(self._future())

    def stop_all(self, message: str) -> None:
        if not self._future().done():
            self._stopped.set_result(message)


@dataclass
class GuardPolicy:
    guarded_paths: set[str]
    max_request_bytes: int
    admission: AdmissionControl
    in_flight: InFlightRequests = field(default_factory=InFlightRequests)
    error_shapes: dict[str, str] = field(
        default_factory=dict
    )  # path -> "openai" (scoring/errors.py)
    body_salt_paths: frozenset[str] = frozenset()  # the guard takes their `cache_salt`
    body_lora_paths: frozenset[str] = frozenset()  # the guard takes their `lora_path`
    model_adapter_paths: frozenset[str] = frozenset()  # `model` may name an adapter


class _ClientGone(Exception):
    pass


class RequestGuard:
    def __init__(
        self,
        app,
        policy: GuardPolicy,
        runtime: GuardRuntime,
        metrics: Callable[[], GuardMetrics] = GuardMetrics,
    ) -> None:
        self.app = app
        self.policy = policy
        self.runtime = runtime
        self._metrics_factory = metrics
        self._metrics: GuardMetrics | None = None

    @property
    def metrics(self) -> GuardMetrics:
        # Created on first use: Prometheus' multiprocess mode must be set up first.
        if self._metrics is None:
            self._metrics = self._metrics_factory()
        return self._metrics

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in ("POST", "PUT")
            or scope["path"] not in self.policy.guarded_paths
        ):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        shape = self.policy.error_shapes.get(path, "sglang")
        if self.runtime.shutting_down():
            self.metrics.rejected("shutting_down")
            await send_json_error(
                send,
                503,
                "server is shutting down; send the request to another replica",
                shape=shape,
            )
            return
        try:
            body = await self._read_body(scope, receive)
            parsed = parse_json_body(body)
            prompts = self.runtime.check(path, parsed)
            authorize = getattr(self.runtime, "authorize", None)
            if authorize is not None:
                await authorize(scope, parsed)
            salt = lora = None
            if path in self.policy.body_salt_paths:
                without, salt = _body_salt(parsed)
                if without is not parsed:
                    body = json.dumps(without).encode()
            if path in self.policy.body_lora_paths:
                without, lora = _body_lora(parsed)
                if without is not parsed:
                    body = json.dumps(without).encode()
            adapter_named = getattr(self.runtime, "adapter_named", None)
            if lora is None and path in self.policy.model_adapter_paths and adapter_named:
                lora = adapter_named(parsed.get("model") if isinstance(parsed, dict) else None)
        except _ClientGone:
            return
        except RequestRefusedError as e:
            self.metrics.rejected("forbidden")
            await send_json_error(send, e.status, str(e), shape=shape)
            return
        except RequestTooLargeError as e:
            self.metrics.rejected("too_large")
            await send_json_error(send, 413, str(e), shape=shape)
            return
        except InvalidRequestError as e:
            self.metrics.rejected("invalid")
            await send_json_error(send, 400, str(e), shape=shape)
            return

        admission = self.policy.admission
        refusal = admission.admit(prompts)
        if refusal is not None:
            self.metrics.rejected("overloaded")
            await send_json_error(send, 503, refusal, headers=[(b"retry-after", b"1")], shape=shape)
            return
        self.metrics.pending(admission.requests, admission.prompts)
        released = False

        def release() -> None:
            # At the last response byte, not when the task ends: a keep-alive client's
            # next request may arrive before this task's clean-up has run.
            nonlocal released
            if not released:
                released = True
                admission.release(prompts)
                self.metrics.pending(admission.requests, admission.prompts)

        try:
            await self._run(scope, receive, send, body, path, release, shape, salt, lora)
        finally:
            release()

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.policy.max_request_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                raise RequestTooLargeError(
                    f"request body is {int(value)} bytes, larger than the {limit} this server "
                    "accepts (--max-request-bytes)"
                )
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLargeError(
                    f"request body is larger than the {limit} bytes this server accepts "
                    "(--max-request-bytes)"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _run(
        self, scope, receive, send, body: bytes, path: str, release, shape, salt=None, lora=None
    ) -> None:
        record = RequestRecord(path=path)
        started = time.perf_counter()
        disconnected = asyncio.Event()
        body_given = False
        response = {"status": 500, "started": False, "complete": False}

        async def replay_receive():
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()  # returns at once when set (is_disconnected() polls)
            return {"type": "http.disconnect"}

        async def send_with_usage(message):
            if message["type"] == "http.response.start":
                response["status"], response["started"] = message["status"], True
                message = {
                    **message,
                    "headers": [*message.get("headers", []), *record.usage.headers()],
                }
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                response["complete"] = True
            await send(message)
            if response["complete"]:
                release()

        # The request's context (the tenant the key check set) with its salt, adapter and
        # record; both tasks copy it, so the endpoint and SGLang's tasks below it see it.
        ctx = current().entering(salt=salt, adapter=lora).replace(record=record)
        with carrying(ctx):
            endpoint = asyncio.create_task(self.app(scope, replay_receive, send_with_usage))
            watcher = asyncio.create_task(receive())
        stop = asyncio.create_task(self.policy.in_flight.wait_for_stop())
        try:
            await asyncio.wait({endpoint, watcher, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not endpoint.done() and not response["complete"]:
                if watcher.done() and watcher.result()["type"] == "http.disconnect":
                    disconnected.set()
                    self.metrics.disconnected()
                    logger.info("client disconnected from %s: aborting its work", path)
                    self.runtime.abort(record)
                    endpoint.cancel()
                elif stop.done():
                    logger.warning("shutdown: aborting a request to %s still running", path)
                    self.runtime.abort(record)
                    endpoint.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await endpoint
                    if not response["started"]:
                        response["status"] = 503
                        await send_json_error(send, 503, stop.result(), shape=shape)
            with contextlib.suppress(asyncio.CancelledError):
                await endpoint
        finally:
            for task in (watcher, stop):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if not endpoint.done():  # we were cancelled ourselves
                self.runtime.abort(record)
                endpoint.cancel()
            self.metrics.finished(
                path, response["status"], time.perf_counter() - started, record.usage
            )


def _body_lora(parsed):
    """take_body_lora, a bad adapter name as the 400 it is."""
    try:
        return take_body_lora(parsed)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None


def _body_salt(parsed):
    """take_body_salt, a bad salt as the 400 it is."""
    try:
        return take_body_salt(parsed)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None
