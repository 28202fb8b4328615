"""The server's lifecycle: once SGLang is up, the scoring front starts, SGLang's SIGTERM
drain is armed at once and a watchdog aborts what still runs --shutdown-timeout seconds
after SIGTERM; the endpoints' on_startup run; the guard's metrics (Prometheus or none)."""

import asyncio
import contextlib
import inspect
import logging

from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.guard import GuardMetrics, InFlightRequests
from prefillonly_sgl.sglang_runtime.http_server.runtime import SGLangRuntime

logger = logging.getLogger(__name__)


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
