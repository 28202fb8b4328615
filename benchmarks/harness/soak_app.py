"""The DSL functions behind /v1/rerank and /v1/classify in the soak benchmark (`serve --app
THIS --rerank film_fits --classify review_mood`); their labels stay tokens of their own
after the prompt with the default model's tokenizer."""

from __future__ import annotations

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt


@prefillonly.ranker(labels=[" Yes", " No"], score=" Yes", item="document")
def film_fits(query: str, document: str) -> Prompt:
    return Prompt(prefix=query, item=f"Film: {document}. A good fit? Answer Yes or No:")


@prefillonly.classifier(labels=[" positive", " negative"])
def review_mood(review: str) -> Prompt:
    return Prompt(prefix="Drug review sentiment.\n", item=f"Review: {review}\nSentiment:")
