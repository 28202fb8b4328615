"""vLLM's generative scoring (its PR #34539): POST /generative_scoring, and its score body
with `label_token_ids` on /v1/score, answered on the prefill-only path (context.score).

Each item's prompt is the query's tokens then the item's (the item's first with
`item_first`), tokenized as vLLM does: the query with `add_special_tokens` (default
true), each item without. An item's score is its first label's probability of being the
next token: with `apply_softmax` (default true) a softmax over the labels alone, without
it the model's probability over the whole vocabulary (vLLM's _compute_probabilities;
SGLang's `apply_softmax` means the same, so SGLang's score is reused as it is). Usage is
vLLM's: the prompts' tokens, and the one token per item that vLLM's max_tokens=1 counts
as completion. Refusals are vLLM's 400s in its error envelope, checked in vLLM's order
(a label out of vocabulary, no labels, no items).

On /v1/score the body is told from SGLang's by its own keys (wire/vllm.py:
is_vllm_generative_score_body): one of vLLM's pair fields (`queries` / `documents`, ...)
with `label_token_ids`. Each distinct query is one scoring call, so its prefix is
computed once.
"""

from __future__ import annotations

import time
import uuid

from pydantic import BaseModel, ConfigDict, Field

from prefillonly_sgl.apis.rerank import model_name
from prefillonly_sgl.apis.vllm_score import VllmPairFields
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.error_bodies import parse_body
from prefillonly_sgl.wire.vllm import is_vllm_generative_score_body, score_fields, score_pairs


class GenerativeScoringRequest(BaseModel):
    """vLLM's GenerativeScoringRequest (POST /generative_scoring)."""

    model_config = ConfigDict(extra="ignore")  # vLLM's scheduling fields (priority, ...)

    model: str | None = None
    query: str | list[int] = Field(description="the query text or its token ids")
    items: list[str] | list[list[int]] = Field(description="item texts or their token ids")
    label_token_ids: list[int] = Field(description="the token ids to give probabilities of")
    apply_softmax: bool = Field(True, description="softmax over the labels only")
    item_first: bool = Field(False, description="each item before the query")
    add_special_tokens: bool = Field(True, description="the query's special tokens")
    cache_salt: str | None = None
    request_id: str | None = None


class VllmLabelScoreRequest(VllmPairFields):
    """vLLM's score body with `label_token_ids`."""

    label_token_ids: list[int] | None = None
    apply_softmax: bool = True
    item_first: bool = False
    add_special_tokens: bool = True


class GenerativeScore(BaseModel):
    index: int
    object: str = "score"
    score: float


class GenerativeScoringUsage(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int = 0


class GenerativeScoringResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[GenerativeScore]
    usage: GenerativeScoringUsage


def check_labels(label_token_ids: list[int] | None, vocab_size: int) -> list[int]:
    """vLLM's label checks, in its order; the labels without repeats (vLLM keys its
    probabilities by id, so a repeated id counts once in the softmax)."""
    if label_token_ids is None:
        raise InvalidRequestError(
            "label_token_ids is required: the token ids whose next-token probabilities "
            "score each document"
        )
    for token_id in label_token_ids:
        if token_id < 0 or token_id >= vocab_size:
            raise InvalidRequestError(
                f"label_token_id {token_id} is out of vocabulary range [0, {vocab_size}). "
                "Please provide valid token IDs."
            )
    if not label_token_ids:
        raise InvalidRequestError("label_token_ids must contain at least one token ID.")
    return list(dict.fromkeys(label_token_ids))


async def first_label_scores(
    context, query, items, labels, apply_softmax, item_first, add_special_tokens
) -> tuple[list[float], int]:
    """(each item's first-label probability, the prompts' tokens) for one query."""
    if not items:
        raise InvalidRequestError("items must contain at least one item.")
    tokenizer = context.tokenizer
    if isinstance(query, str):
        query = tokenizer.encode(query, add_special_tokens=add_special_tokens)
    # vLLM tokenizes items without special tokens (no second BOS in the prompt).
    items = [tokenizer.encode(i, add_special_tokens=False) if isinstance(i, str) else i
             for i in items]  # fmt: skip
    result = await context.score(query, items, labels, apply_softmax, item_first)
    prompt_tokens = sum(len(query) + len(item) for item in items)
    return [row[0] for row in result.scores], prompt_tokens


def _answer(request_id: str, context, model, scores, prompt_tokens) -> GenerativeScoringResponse:
    completion = len(scores)  # vLLM's max_tokens=1: one token per item
    return GenerativeScoringResponse(
        id=request_id,
        created=int(time.time()),
        model=model_name(context, model),
        data=[GenerativeScore(index=i, score=s) for i, s in enumerate(scores)],
        usage=GenerativeScoringUsage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            total_tokens=prompt_tokens + completion,
        ),
    )


async def _generative_scoring(body: object, context) -> GenerativeScoringResponse:
    request = parse_body(GenerativeScoringRequest, body)
    labels = check_labels(request.label_token_ids, context.limits.vocab_size)
    scores, prompt_tokens = await first_label_scores(
        context, request.query, request.items, labels, request.apply_softmax,
        request.item_first, request.add_special_tokens,
    )  # fmt: skip
    request_id = f"generative-scoring-{request.request_id or uuid.uuid4().hex}"
    return _answer(request_id, context, request.model, scores, prompt_tokens)


async def _label_score(body: object, context) -> GenerativeScoringResponse:
    first, second = score_fields(body)
    request = parse_body(VllmLabelScoreRequest, body)
    labels = check_labels(request.label_token_ids, context.limits.vocab_size)
    pairs = score_pairs(getattr(request, first), getattr(request, second), (first, second))
    by_query: dict[str, list[int]] = {}
    for i, (query, _) in enumerate(pairs):
        by_query.setdefault(query, []).append(i)
    scores, prompt_tokens = [0.0] * len(pairs), 0
    for query, indices in by_query.items():
        found, tokens = await first_label_scores(
            context, query, [pairs[i][1] for i in indices], labels, request.apply_softmax,
            request.item_first, request.add_special_tokens,
        )  # fmt: skip
        prompt_tokens += tokens
        for i, score in zip(indices, found, strict=True):
            scores[i] = score
    return _answer(f"score-{uuid.uuid4().hex}", context, request.model, scores, prompt_tokens)


def _count_items(body: dict) -> int:
    return len(body.get("items") or []) or 1


def _count_pairs(body: dict) -> int:
    first, second = score_fields(body)
    return len(score_pairs(body[first], body[second], (first, second)))


def vllm_generative_scoring_endpoints() -> list[EndpointSpec]:
    """/generative_scoring, and vLLM's label body on /v1/score."""
    return [
        EndpointSpec(
            "/generative_scoring",
            GenerativeScoringRequest,
            GenerativeScoringResponse,
            _generative_scoring,
            summary="vLLM's generative scoring: each item's first-label probability",
            tags=("prefillonly",),
            count_prompts=_count_items,
            raw_body=True,  # parsed here, so a refusal is vLLM's 400 naming the field
            error_shape="vllm",
        ),
        EndpointSpec(
            "/v1/score",
            VllmLabelScoreRequest,
            GenerativeScoringResponse,
            _label_score,
            summary="vLLM's score body with label_token_ids (generative scoring)",
            tags=("prefillonly",),
            count_prompts=_count_pairs,
            raw_body=True,
            error_shape="vllm",
            claims=is_vllm_generative_score_body,
        ),
    ]
