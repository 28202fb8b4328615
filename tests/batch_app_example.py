"""DSL functions the batch-runner tests run (also through `prefillonly batch FILE:NAME`)."""

from __future__ import annotations

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt

FEW_SHOT = (
    "Review: this medicine worked well\nSentiment: Yes\n\n"
    "Review: terrible side effects\nSentiment: No\n\n"
)


@prefillonly.classifier(labels=["Yes", "No"])
def liked(review: str, drug: str = "") -> Prompt:
    """Whether a review is positive, behind a shared few-shot prefix."""
    return Prompt(prefix=FEW_SHOT, item=f"Drug: {drug}\nReview: {review}\nSentiment:")


@prefillonly.classifier(labels=["Yes", "history books", "No thanks"])
def verdict(review: str, drug: str = "") -> Prompt:
    """Labels of several tokens (the tiny tokenizer: 1, 4 and 5 tokens)."""
    return Prompt(prefix=FEW_SHOT, item=f"Drug: {drug}\nReview: {review}\nVerdict:")


@prefillonly.ranker(labels=["Yes", "No"], score="Yes")
def recommend(profile: str, item: str) -> Prompt:
    return Prompt(prefix=f"User profile: {profile}\n", item=f"Item: {item}\nRelevant?")
