"""A `serve --app` module made of DSL functions (tests/test_app_endpoints.py):

    prefillonly serve --model-path MODEL --app tests/dsl_app_example.py

exposes POST /apps/sentiment, /apps/sentiment/batch, /apps/calibrated_sentiment (and its
/batch), /apps/recommend, and the decision function `triage`: POST /decisions/triage, and
/v1/decisions or /v1/systemone with "model": "triage" (tests/test_decisions_dsl.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt

FEW_SHOT = (
    "Review: this medicine worked well\nSentiment: positive\n\n"
    "Review: terrible side effects\nSentiment: negative\n\n"
)


@prefillonly.classifier
def sentiment(review: str, drug: str = "the medicine") -> Literal["positive", "negative"]:
    """Sentiment of a drug review (few-shot)."""
    return Prompt(prefix=FEW_SHOT, item=f"Review of {drug}: {review}\nSentiment:")


@prefillonly.classifier(calibrate="review")
def calibrated_sentiment(
    review: str, drug: str = "the medicine"
) -> Literal["positive", "negative"]:
    """``sentiment`` with contextual calibration (the prior measured once per server)."""
    return sentiment.fn(review, drug)


@prefillonly.ranker(labels=["Yes", "No"], score="Yes")
def recommend(profile: str, item: str) -> Prompt:
    """Films the user would enjoy, best first."""
    return Prompt(
        prefix=f"User profile: {profile}\n",
        item=f"Item: {item}\nRelevant? Answer Yes or No:",
    )


class Triage(BaseModel):
    billing: bool = Field(description="Is the ticket about billing?")
    team: Annotated[
        Literal["billing", "technical support", "sales"],
        prefillonly.Options(billing="payments and refunds"),
    ] = Field(description="Which team should handle the ticket?")
    urgency: Annotated[int, prefillonly.Scale("low", "normal", "urgent")] = Field(
        description="How urgent is the ticket?"
    )


@prefillonly.decision
def triage(ticket: str) -> Triage:
    """Routes a support ticket: three questions about it, one state."""
    return [
        {"role": "system", "content": "You triage support tickets."},
        {"role": "user", "content": f"Ticket: {ticket}"},
    ]
