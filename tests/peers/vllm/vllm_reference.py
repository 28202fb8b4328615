"""The independent reference the ported vLLM tests check values against: a plain
transformers forward (prefillonly_sgl.verification.reference) of the default reranker's prompts, in
place of vLLM's trained cross-encoder (sentence-transformers' CrossEncoder.predict)."""

from __future__ import annotations

import math

from prefillonly_sgl.apis.rerankers import query_likelihood


def reference_relevance(reference, query: str, documents: list[str]) -> list[float]:
    """The default reranker's relevance of each document by a transformers forward:
    exp of the query's mean token log-probability after the document."""
    (request,) = query_likelihood.compile(reference.tokenizer, query, items=documents).requests
    rows = reference.continuation_logprobs(
        request.query, list(request.items), list(request.continuations)
    )
    return [math.exp(sum(row) / len(row)) for row in rows]
