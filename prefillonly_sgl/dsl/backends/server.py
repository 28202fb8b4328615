"""A serving runtime's own scoring path as a DSL backend: what `prefillonly serve`'s typed
endpoints and built-in APIs run their jobs on (handlers are async: no synchronous use)."""

from __future__ import annotations

from prefillonly_sgl.dsl.backends.base import Backend
from prefillonly_sgl.dsl.backends.registry import REGISTRY
from prefillonly_sgl.dsl.request import ContinuationRequest, ScoreRequest


class ServerBackend(Backend):
    """A serving runtime's own scoring path as a DSL backend (asyncio only: handlers are
    async). One per runtime (``server_backend``), so a calibrated classifier's priors are
    measured once per server, not per request."""

    def __init__(self, context) -> None:
        self.context = context

    @property
    def tokenizer(self):
        return self.context.tokenizer

    @property
    def class_labels(self):
        head = self.context.class_head
        return None if head is None else head.labels

    async def score(self, request: ScoreRequest) -> list[list[float]]:
        return (await request.sent_to(self.context.score)).scores

    async def continuation_logprobs(self, request: ContinuationRequest) -> list[list[float]]:
        return (await request.sent_to(self.context.continuation_logprobs)).token_logprobs

    def wait(self, coroutine):
        coroutine.close()
        raise RuntimeError("a server's backend runs in its handlers: await backend.run(job)")


def server_backend(context) -> ServerBackend:
    """The backend of a serving runtime's context (one context per runtime, so one backend:
    the registry keeps it as long as the runtime lives)."""
    return REGISTRY.kept(context, ServerBackend)
