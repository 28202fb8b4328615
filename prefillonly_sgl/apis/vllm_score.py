"""POST /v1/score in vLLM's shapes, beside SGLang's own on the same path.

vLLM's score request pairs texts: `queries` with `documents` (or `items`), `data_1` with
`data_2`, `text_1` with `text_2`; one query against every document, or the i-th with the
i-th. A body with one of those keys and neither of SGLang's `query` / `label_token_ids`
is vLLM's (wire.vllm.is_vllm_score_body; EndpointSpec.claims hands it here);
every other body stays SGLang's. Each pair is scored by the server's reranker (the one
/v1/rerank uses: apis/rerankers.py or `--rerank NAME`), a call per distinct query, so its
prefix is computed once. The answer is vLLM's ScoreResponse: {id, object: "list",
created, model, data [{index, object: "score", score}], usage}, a score being the pair's
relevance in [0, 1] (vLLM's `use_activation: false`: before the sigmoid).
"""

from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefillonly_sgl.apis.rerank import Reranker, call_usage, model_name
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.error_bodies import parse_body
from prefillonly_sgl.wire.cohere import positive_max_tokens_per_doc
from prefillonly_sgl.wire.prefillonly import Usage
from prefillonly_sgl.wire.vllm import is_vllm_score_body, score_fields, score_pairs

Texts = str | list[str]


class VllmPairFields(BaseModel):
    """vLLM's score body's pair fields (which pair a body uses: wire.vllm.score_fields),
    shared by its reranker body (below) and its generative-scoring body
    (vllm_generative_scoring.py)."""

    model_config = ConfigDict(extra="ignore")  # vLLM's other fields (priority, ...)

    model: str | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    text_1: Texts | None = None
    text_2: Texts | None = None


class VllmScoreRequest(VllmPairFields):
    max_tokens_per_doc: int | None = Field(None, description="cut each document to N tokens")
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="each pair's whole prompt at most N tokens (-1: what fits)"
    )
    use_activation: bool | None = Field(None, description="false: scores before the sigmoid")

    @field_validator("max_tokens_per_doc")
    @classmethod
    def _positive_max_tokens_per_doc(cls, value: int | None) -> int | None:
        return positive_max_tokens_per_doc(value)


class VllmScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class VllmScoreUsage(Usage):
    completion_tokens: int = 0


class VllmScoreResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[VllmScoreData]
    usage: VllmScoreUsage


def vllm_score_endpoint(function) -> EndpointSpec:
    """vLLM's /v1/score shapes, scored by the ranker ``function`` (a DSL ranker the rerank
    APIs accept)."""
    reranker = Reranker(function)

    async def score(body: object, context) -> VllmScoreResponse:
        first, second = score_fields(body)
        request = parse_body(VllmScoreRequest, body)
        pairs = score_pairs(getattr(request, first), getattr(request, second), (first, second))
        by_query: dict[str, list[int]] = {}
        for i, (query, _) in enumerate(pairs):
            by_query.setdefault(query, []).append(i)
        scores = [0.0] * len(pairs)
        for query, indices in by_query.items():
            answer = await reranker.rerank(
                context,
                query,
                [pairs[i][1] for i in indices],
                max_tokens_per_doc=request.max_tokens_per_doc,
                field=second,
                truncate_prompt_tokens=request.truncate_prompt_tokens,
            )
            for item in answer.items:
                scores[indices[item.index]] = answer.relevance(item, request.use_activation)
        usage = call_usage(context)  # the whole request's, every call included
        return VllmScoreResponse(
            id=f"score-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=model_name(context, request.model),
            data=[VllmScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=VllmScoreUsage(**usage.model_dump()),
        )

    def count(body: dict) -> int:
        first, second = score_fields(body)
        return len(score_pairs(body[first], body[second], (first, second)))

    return EndpointSpec(
        "/v1/score",
        VllmScoreRequest,
        VllmScoreResponse,
        score,
        summary=f"vLLM's score shapes: (query, document) pairs ({reranker.name})",
        tags=("prefillonly",),
        count_prompts=count,
        raw_body=True,
        claims=is_vllm_score_body,
    )
