"""Hugging Face TEI's rerank shape (`POST /rerank`, what LlamaIndex's and LangChain's TEI
rerankers send; plain pydantic). Served by apis/rerank.py with the same scorer as
/v1/rerank. A /rerank body with `documents` instead of TEI's `texts` is vLLM's
(docs/server.md, "Peer conventions on one path"). TEI publishes no image field: on a
vision-language model ours, `image_data` (the query's images) and `item_image_data` (per
text, its own), as /v1/score names them (docs/images.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
)

from prefillonly_sgl.wire.fields import cache_salt_field


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
    image_data: str | list[str] | None = Field(
        None, description="ours: the query's images (URLs or data URLs), shared by every text"
    )
    item_image_data: list[list[str]] | None = Field(
        None, description="ours: per text, its own images (URLs or data URLs)"
    )


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """TEI's answer: every text, best first."""
