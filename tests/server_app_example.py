"""A hand-written `serve --app` module: what a DSL classifier and ranker will declare.

    prefillonly serve --model-path MODEL --app tests/server_app_example.py

- SENTIMENT implements the protocol: an object with __prefillonly_endpoint__().
- RELEVANCE is a plain EndpointSpec (a ranker: one prompt per item).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from prefillonly_sgl.scoring.labels import label_word_ids
from prefillonly_sgl.server.endpoints import EndpointSpec


class Review(BaseModel):
    text: str = Field(..., min_length=1, description="the review to classify")


class Sentiment(BaseModel):
    label: Literal["positive", "negative"]
    probabilities: dict[str, float]


class SentimentClassifier:
    """Stands in for a DSL classifier: a prompt template and single-token labels."""

    labels = {"positive": " positive", "negative": " negative"}

    def __init__(self) -> None:
        self.label_ids: list[int] | None = None

    def prompt(self, text: str) -> str:
        return f"Review: {text}\nSentiment:"

    def startup(self, context) -> None:
        # Fails at server start if a label cannot be scored with this model's tokenizer.
        self.label_ids = label_word_ids(context.tokenizer, list(self.labels.values()))

    async def classify(self, request: Review, context) -> Sentiment:
        result = await context.score(self.prompt(request.text), [""], self.label_ids)
        probabilities = dict(zip(self.labels, result.scores[0]))
        return Sentiment(
            label=max(probabilities, key=probabilities.get), probabilities=probabilities
        )

    def __prefillonly_endpoint__(self) -> EndpointSpec:
        return EndpointSpec(
            "/classify/sentiment",
            Review,
            Sentiment,
            self.classify,
            summary="Sentiment of a drug review",
            on_startup=self.startup,
        )


SENTIMENT = SentimentClassifier()


class RelevanceRequest(BaseModel):
    profile: str
    items: list[str] = Field(..., min_length=1, max_length=64)


class RelevanceResponse(BaseModel):
    scores: list[float] = Field(..., description="P(Yes) per item, in request order")
    cached_tokens: int = Field(..., description="prompt tokens served from the prefix cache")


async def relevance(request: RelevanceRequest, context) -> RelevanceResponse:
    query = f"User profile: {request.profile}\n"
    items = [f"Item: {item} Relevant? Answer Yes or No:" for item in request.items]
    yes, no = label_word_ids(context.tokenizer, [" Yes", " No"], [query + i for i in items])
    result = await context.score(query, items, [yes, no])
    return RelevanceResponse(
        scores=[row[0] for row in result.scores], cached_tokens=result.cached_tokens
    )


RELEVANCE = EndpointSpec(
    "/rank/relevance",
    RelevanceRequest,
    RelevanceResponse,
    relevance,
    count_prompts=lambda body: len(body.get("items") or []),
)
