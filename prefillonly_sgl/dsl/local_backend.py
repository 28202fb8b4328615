"""The DSL on a ``prefillonly_sgl.Engine`` in this process."""

from __future__ import annotations

from prefillonly_sgl.dsl.backend import Backend
from prefillonly_sgl.dsl.request import ScoreRequest


class LocalEngineBackend(Backend):
    """A ``prefillonly_sgl.Engine`` in this process."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def score(self, request: ScoreRequest) -> list[list[float]]:
        result = self.engine.score(**engine_arguments(request))
        self.count_usage(result.prompt_tokens, result.cached_tokens)
        return result.scores

    async def ascore(self, request: ScoreRequest) -> list[list[float]]:
        result = await self.engine.async_score(**engine_arguments(request))
        self.count_usage(result.prompt_tokens, result.cached_tokens)
        return result.scores

    def __repr__(self) -> str:
        return f"LocalEngineBackend({self.engine!r})"


def engine_arguments(request: ScoreRequest) -> dict:
    """Engine.score's keyword arguments for a compiled request."""
    return dict(
        query=request.query,
        items=list(request.items),
        label_token_ids=list(request.label_token_ids),
        apply_softmax=request.apply_softmax,
        length_normalize=request.length_normalize,
    )
