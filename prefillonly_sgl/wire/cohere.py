"""Cohere's rerank shapes (plain pydantic): v1 (`POST /v1/rerank`, what `cohere.Client().rerank`
sends; also Jina's and SGLang's body) and v2 (`POST /v2/rerank`, what
`cohere.ClientV2().rerank` sends). Served by apis/rerank.py with one scorer; posted by the
DSL's gateway client (dsl/gateway_client.py) through SGLang's gateway. vLLM serves its own
rerank shape on /v2/rerank too: the v2 answer carries vLLM's fields as well (`model`,
`usage`, each result's `document`; docs/server.md, "Peer conventions on one path").
On a vision-language model a query or document may carry images in SGLang's, vLLM's or
Jina's multimodal rerank shape (wire/rerank_content.py), and `image_data` the query's."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_serializer,
)

from prefillonly_sgl.wire.fields import cache_salt_field
from prefillonly_sgl.wire.prefillonly import Usage
from prefillonly_sgl.wire.rerank_content import ContentPart, DocumentObject

# A query or a document: text, or on a vision-language model text with images in the
# multimodal rerank shapes (wire/rerank_content.py).
Query = Annotated[str, Field(min_length=1)] | list[ContentPart] | DocumentObject
Document = str | list[ContentPart] | DocumentObject
IMAGE_DATA_DESCRIPTION = (
    "ours, on a vision-language model: the query's images (a URL or data URL, or a list), "
    "shared by every document (docs/images.md)"
)


class RerankDocument(BaseModel):
    """A document as an answer echoes it (its text; never its images)."""

    text: str


class RerankRequest(BaseModel):
    # Clients send fields of their providers (rank_fields, max_tokens_per_doc, ...):
    # ignored rather than refused, so a Cohere-style request works unchanged.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: Query = Field(..., description="what the documents are ranked for")
    documents: list[Document] = Field(
        ..., min_length=1, description="texts (or {'text': ...}; with images: docs/images.md)"
    )
    image_data: str | list[str] | None = Field(None, description=IMAGE_DATA_DESCRIPTION)
    top_n: int | None = Field(None, description="return the best n (default: all)")
    return_documents: bool | None = Field(
        None,
        description="echo each document in its result (default: echoed, vLLM's convention, "
        "except for a request carrying a field only Cohere's API has: not echoed, Cohere's)",
    )
    rank_fields: list[str] | None = Field(None, description="Cohere's; accepted, not used")
    max_chunks_per_doc: int | None = Field(None, description="Cohere's; accepted, not used")
    instruction: str | None = Field(
        None, description="task instruction, for rankers that take one (also 'instruct')"
    )
    instruct: str | None = Field(None, description="SGLang's name for instruction")
    top_k: int | None = Field(None, description="SGLang's gateway's name for top_n")
    rid: str | list[str] | None = Field(
        None, description="SGLang's request id; its presence asks for SGLang's native answer"
    )
    user: str | None = None
    max_tokens_per_doc: int | None = Field(
        None, description="cut each document to its first N tokens (Cohere v2's field)"
    )
    use_activation: bool | None = Field(
        None,
        description="vLLM's: false gives each relevance before its sigmoid, log(r / (1 - r))",
    )
    truncate_prompt_tokens: int | None = Field(
        None,
        ge=-1,
        description="vLLM's: cut each document so its whole prompt is at most N tokens "
        "(-1: as many as fit)",
    )
    cache_salt: str | None = cache_salt_field()

    @field_validator("max_tokens_per_doc")
    @classmethod
    def _positive_max_tokens_per_doc(cls, value: int | None) -> int | None:
        return positive_max_tokens_per_doc(value)

    @property
    def wants_sglang_answer(self) -> bool:
        # smg serialises its RerankRequest with "rid" (null or not) and parses the worker's
        # answer as SGLang's list; Cohere / Jina clients never send "rid".
        return "rid" in self.model_fields_set


def positive_max_tokens_per_doc(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise ValueError(f"max_tokens_per_doc must be a positive integer, got {value}")
    return value


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None

    @model_serializer(mode="wrap")
    def _leave_out_no_document(self, handler):
        # Cohere's answer has no `document` key when none was asked for (its SDK's
        # model: "if return_documents is false this will return none"); never null.
        data = handler(self)
        if self.document is None:
            data.pop("document", None)
        return data


class RerankApiVersion(BaseModel):
    version: str


class RerankBilledUnits(BaseModel):
    search_units: int = 1


class RerankTokens(BaseModel):
    input_tokens: int
    output_tokens: int = 0


class RerankResponseMeta(BaseModel):
    """Cohere's `meta` (api_version, billed_units, tokens), naming the ranker and its
    method ("judge": a label's probability; "likelihood": the query's log-probability)."""

    api_version: RerankApiVersion
    billed_units: RerankBilledUnits = RerankBilledUnits()
    tokens: RerankTokens
    ranker: str
    method: str


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage
    meta: RerankResponseMeta | None = None


COHERE_V2_MAX_TOKENS_PER_DOC = 4096  # Cohere's documented default


class RerankV2Request(BaseModel):
    # Cohere's other fields (priority, ...) are accepted and ignored, as on /v1/rerank.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: Query = Field(..., description="what the documents are ranked for")
    documents: list[Document] = Field(
        ..., min_length=1, description="texts to rank (with images: docs/images.md)"
    )
    image_data: str | list[str] | None = Field(None, description=IMAGE_DATA_DESCRIPTION)
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
