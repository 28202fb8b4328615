"""Typed endpoints every `prefillonly serve` has, declared with the same EndpointSpec
extension point as `--app` endpoints.

POST /v1/score_labels: /v1/score with label *words* instead of token ids, for clients that
do not hold the model's tokenizer:
    {"query": "Review: great!\\nSentiment:", "items": [""], "labels": [" positive", " negative"]}
 -> {"scores": [{" positive": 0.93, " negative": 0.07}], "usage": {...}}
Each label is taken verbatim and must be a single token where it follows each prompt (the
DSL's label compiler, dsl/labels.py: a 400 names a label that is several tokens or merges
with the prompt's end).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from prefillonly_sgl.dsl.labels import label_word_ids
from prefillonly_sgl.server.endpoints import EndpointSpec


class ScoreLabelsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field("", description="text before each item (may be empty)")
    items: list[str] = Field(..., min_length=1, description="texts appended to the query")
    labels: list[str] = Field(
        ..., min_length=1, description="candidate next words; each must be one token"
    )
    apply_softmax: bool = Field(
        True, description="normalise over the labels (false: probability over the vocabulary)"
    )
    item_first: bool = Field(False, description="item before query instead of after")


class ScoreLabelsUsage(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    queue_time: float | None = None
    running_time: float | None = None


class ScoreLabelsResponse(BaseModel):
    scores: list[dict[str, float]] = Field(..., description="per item: label -> probability")
    usage: ScoreLabelsUsage | None = None


async def score_labels(request: ScoreLabelsRequest, context) -> ScoreLabelsResponse:
    """Probabilities of the label words after each query+item prompt."""
    prompts = [
        f"{item}{request.query}" if request.item_first else f"{request.query}{item}"
        for item in request.items
    ]
    label_ids = label_word_ids(context.tokenizer, request.labels, prompts)
    result = await context.score(
        request.query,
        request.items,
        label_ids,
        apply_softmax=request.apply_softmax,
        item_first=request.item_first,
    )
    usage = context.usage
    return ScoreLabelsResponse(
        scores=[dict(zip(request.labels, row)) for row in result.scores],
        usage=None
        if usage is None
        else ScoreLabelsUsage(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            queue_time=usage.queue_time,
            running_time=usage.running_time,
        ),
    )


def _items_in(body: dict) -> int:
    items = body.get("items")
    return len(items) if isinstance(items, list) else 1


BUILTIN_ENDPOINTS = [
    EndpointSpec(
        "/v1/score_labels",
        ScoreLabelsRequest,
        ScoreLabelsResponse,
        score_labels,
        summary="Score label words (not token ids) after each query+item",
        tags=("prefillonly",),
        count_prompts=_items_in,
    )
]
