"""POST /v1/score_labels: /v1/score with label *words* instead of token ids, for clients
that do not hold the model's tokenizer, and labels of any number of tokens:
    {"query": "Review: great!\\nSentiment:", "items": [""], "labels": [" very good", " bad"]}
 -> {"scores": [{" very good": 0.93, " bad": 0.07}], "rows": [[0.93, 0.07]], "usage": {...}}
Each label is taken verbatim, tokenized where it follows each prompt (the DSL's label
compiler, scoring/labels.py: a 400 names a label that merges with the prompt's end); a label
of several tokens scores the product of their probabilities (docs/labels.md).
Instead of words, "label_token_ids" gives the labels as token ids (per label an id or a
list of ids): what the DSL's remote backend sends for labels of several tokens, which
SGLang's /v1/score cannot carry. "rows" lists each item's scores in label order.
On a vision-language model, "image_data" (the query's images) and "item_image_data" (per
item) as URLs or data URLs (docs/images.md).
The request and response models are the wire contract (prefillonly_sgl/wire/prefillonly.py).
"""

from __future__ import annotations

import json

from prefillonly_sgl.scoring.labels import label_word_ids
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.wire.prefillonly import (
    ScoreLabelsRequest,
    ScoreLabelsResponse,
    score_labels_usage,
)


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
        names = [json.dumps(label) for label in label_ids]  # as sent: "5", "[5, 6]"
    images = {}
    if request.image_data is not None or request.item_image_data is not None:
        images = {"images": request.image_data, "item_images": request.item_image_data}
    result = await context.score(
        request.query,
        request.items,
        label_ids,
        apply_softmax=request.apply_softmax,
        item_first=request.item_first,
        length_normalize=request.length_normalize,
        temperature=request.temperature,
        **images,
    )
    usage = context.usage
    return ScoreLabelsResponse(
        scores=[dict(zip(names, row)) for row in result.scores],
        rows=result.scores,
        usage=None if usage is None else score_labels_usage(usage),
    )


def _items_in(body: dict) -> int:
    items = body.get("items")
    return len(items) if isinstance(items, list) else 1


def score_labels_endpoint() -> EndpointSpec:
    return EndpointSpec(
        "/v1/score_labels",
        ScoreLabelsRequest,
        ScoreLabelsResponse,
        score_labels,
        summary="Score label words (not token ids) after each query+item",
        tags=("prefillonly",),
        count_prompts=_items_in,
    )
