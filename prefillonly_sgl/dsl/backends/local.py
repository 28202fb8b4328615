"""The DSL on a ``prefillonly_sgl.Engine`` in this process."""

from __future__ import annotations

from prefillonly_sgl.dsl.backends.base import Backend
from prefillonly_sgl.dsl.request import ContinuationRequest, ScoreRequest


class LocalEngineBackend(Backend):
    """A ``prefillonly_sgl.Engine`` in this process (one per Engine: backends.as_backend).

    Its coroutines run on the engine's event loop (SGLang's tokenizer manager answers
    there), so ``wait`` hands them to it rather than to a loop of their own."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def class_labels(self):
        return self.engine.class_labels

    async def score(self, request: ScoreRequest) -> list[list[float]]:
        result = await request.sent_to(self.engine.async_score)
        self.count_usage(result.prompt_tokens, result.cached_tokens)
        return result.scores

    async def continuation_logprobs(self, request: ContinuationRequest) -> list[list[float]]:
        result = await request.sent_to(self.engine.async_continuation_logprobs)
        self.count_usage(result.prompt_tokens, result.cached_tokens)
        return result.token_logprobs

    def wait(self, coroutine):
        return self.engine.run_until_complete(coroutine)

    def __repr__(self) -> str:
        return f"LocalEngineBackend({self.engine!r})"
