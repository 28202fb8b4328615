"""Typed endpoints every `prefillonly serve` has, declared with the same EndpointSpec
extension point as `--app` endpoints.

POST /v1/score_labels: /v1/score with label *words* instead of token ids, for clients that
do not hold the model's tokenizer, and labels of any number of tokens:
    {"query": "Review: great!\\nSentiment:", "items": [""], "labels": [" very good", " bad"]}
 -> {"scores": [{" very good": 0.93, " bad": 0.07}], "rows": [[0.93, 0.07]], "usage": {...}}
Each label is taken verbatim, tokenized where it follows each prompt (the DSL's label
compiler, dsl/labels.py: a 400 names a label that merges with the prompt's end); a label
of several tokens scores the product of their probabilities (docs/labels.md).
Instead of words, "label_token_ids" gives the labels as token ids (per label an id or a
list of ids): what the DSL's remote backend sends for labels of several tokens, which
SGLang's /v1/score cannot carry. "rows" lists each item's scores in label order.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefillonly_sgl.dsl.labels import label_word_ids
from prefillonly_sgl.server.endpoints import EndpointSpec


class ScoreLabelsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field("", description="text before each item (may be empty)")
    items: list[str] = Field(..., min_length=1, description="texts appended to the query")
    labels: list[str] | None = Field(
        None, min_length=1, description="candidate next words, written verbatim (any length)"
    )
    label_token_ids: list[int | list[int]] | None = Field(
        None,
        min_length=1,
        description="instead of labels: per label a token id or a list of token ids",
    )
    apply_softmax: bool = Field(
        True, description="normalise over the labels (false: probability over the vocabulary)"
    )
    length_normalize: bool = Field(
        False, description="a label's per-token (geometric mean) probability, not the product"
    )
    item_first: bool = Field(False, description="item before query instead of after")

    @model_validator(mode="after")
    def _one_kind_of_labels(self):
        if (self.labels is None) == (self.label_token_ids is None):
            raise ValueError("give exactly one of labels (words) and label_token_ids")
        return self


class ScoreLabelsUsage(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    queue_time: float | None = None
    running_time: float | None = None


class ScoreLabelsResponse(BaseModel):
    scores: list[dict[str, float]] = Field(..., description="per item: label -> probability")
    rows: list[list[float]] = Field(..., description="per item: the scores in label order")
    usage: ScoreLabelsUsage | None = None


async def score_labels(request: ScoreLabelsRequest, context) -> ScoreLabelsResponse:
    """Probabilities of the label words after each query+item prompt."""
    if request.labels is not None:
        prompts = [
            f"{item}{request.query}" if request.item_first else f"{request.query}{item}"
            for item in request.items
        ]
        label_ids = label_word_ids(context.tokenizer, request.labels, prompts)
        names = request.labels
    else:
        label_ids = request.label_token_ids
        names = [str(label) for label in label_ids]
    result = await context.score(
        request.query,
        request.items,
        label_ids,
        apply_softmax=request.apply_softmax,
        item_first=request.item_first,
        length_normalize=request.length_normalize,
    )
    usage = context.usage
    return ScoreLabelsResponse(
        scores=[dict(zip(names, row)) for row in result.scores],
        rows=result.scores,
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
