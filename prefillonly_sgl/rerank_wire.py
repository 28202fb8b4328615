"""The rerank shapes other than Cohere v1's (which is wire.py's RerankRequest): Cohere's
v2 (`POST /v2/rerank`, what `cohere.ClientV2().rerank` sends) and Hugging Face TEI's
(`POST /rerank`, what LlamaIndex's and LangChain's TEI rerankers send). Served by
apis/rerank.py with the same scorer as /v1/rerank (plain pydantic). vLLM serves its own
rerank shape on /v2/rerank and /rerank too: the v2 answer carries vLLM's fields as well
(`model`, `usage`, each result's `document`), and a /rerank body with `documents` instead
of TEI's `texts` is vLLM's (docs/server.md, "Peer conventions on one path")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator

from prefillonly_sgl.wire import (
    RerankResponseMeta,
    RerankResult,
    Usage,
    cache_salt_field,
    positive_max_tokens_per_doc,
)

COHERE_V2_MAX_TOKENS_PER_DOC = 4096  # Cohere's documented default


class RerankV2Request(BaseModel):
    # Cohere's other fields (priority, ...) are accepted and ignored, as on /v1/rerank.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: str = Field(..., min_length=1, description="what the documents are ranked for")
    documents: list[str] = Field(..., min_length=1, description="texts to rank")
    top_n: int | None = Field(None, description="return the best n (default: all)")
    max_tokens_per_doc: int = Field(
        COHERE_V2_MAX_TOKENS_PER_DOC, description="cut each document to its first N tokens"
    )
    relevant_spans: dict | None = Field(None, description="not supported: must be off")
    # vLLM's fields (a vLLM client posts its rerank body here too).
    return_documents: bool | None = Field(
        None, description="echo each document (default: echoed, as vLLM's answer has it)"
    )
    use_activation: bool | None = Field(
        None, description="vLLM's: false gives each relevance before its sigmoid"
    )
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="vLLM's: each document's whole prompt at most N tokens"
    )
    cache_salt: str | None = cache_salt_field()

    @field_validator("max_tokens_per_doc")
    @classmethod
    def _positive_max_tokens_per_doc(cls, value: int) -> int:
        return positive_max_tokens_per_doc(value)


class RerankV2Response(BaseModel):
    """Cohere v2's answer (id, results [{index, relevance_score}], meta) with vLLM's fields
    beside them (model, usage, each result's document), so both clients read one answer
    (Cohere's v2 models allow extra fields; vLLM's requires its own)."""

    id: str
    model: str
    results: list[RerankResult]
    usage: Usage
    meta: RerankResponseMeta


class TeiRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # TEI refuses unknown fields too

    query: str = Field(..., min_length=1, description="what the texts are ranked for")
    texts: list[str] = Field(..., min_length=1, description="texts to rank")
    raw_scores: bool = Field(
        False, description="the ranker's own score (mean log-probability for query likelihood)"
    )
    return_text: bool = Field(False, description="echo each text in its result")
    truncate: bool = Field(
        False, description="cut texts that do not fit the model's context (else a 400)"
    )
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Right: keep a text's start; Left: keep its end"
    )
    cache_salt: str | None = cache_salt_field()  # ours (TEI has no such field)


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """TEI's answer: every text, best first."""
