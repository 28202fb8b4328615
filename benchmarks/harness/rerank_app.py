"""The ranker behind /v1/rerank in the gateway benchmark (`serve --app THIS --rerank
fan_rates_it`): the recommendation workload's own prompt, whose yes/no labels are single
tokens for the default model (the built-in Qwen3-Reranker prompt's are not: SmolLM2's
tokenizer merges them with the prompt's closing newlines)."""

from __future__ import annotations

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Prompt


@prefillonly.ranker(labels=[" Yes", " No"], score=" Yes", item="document")
def fan_rates_it(query: str, document: str) -> Prompt:
    return Prompt(
        prefix=query,
        item=f"Candidate: {document}. Will this fan rate it 4/5 or more? Answer Yes or No:",
    )
