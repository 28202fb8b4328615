"""DSL functions behind /v1/rerank and /v1/classify in the ranking-API tests."""

from __future__ import annotations

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt


# "very negative" is 4 tokens of the tiny tokenizer: /v1/classify (and the gateway's path
# to it) scores a label of several tokens.
@prefillonly.classifier(labels=["positive", "very negative"])
def review_sentiment(review: str) -> Prompt:
    return Prompt(prefix="Review sentiment.\n", item=f"Review: {review}\nSentiment:")


@prefillonly.ranker(labels=["Yes", "No"], score="Yes", item="document")
def relevant(query: str, document: str) -> Prompt:
    return Prompt(prefix=f"Question: {query}\n", item=f"Item: {document}\nRelevant?")


@prefillonly.ranker(method="likelihood", item="document")
def likely_answer(query: str, document: str) -> Prompt:
    """A likelihood ranker: the query's log-probability after the document."""
    return Prompt(
        prefix="Answer questions.\n", item=f"Text: {document}\nQ:", continuation=f" {query}"
    )


@prefillonly.ranker(labels=["Yes", "No"], score="Yes", item="document")
def needs_user(query: str, user: str, document: str) -> Prompt:
    return Prompt(prefix=f"{user}: {query}\n", item=f"Item: {document}\nRelevant?")
