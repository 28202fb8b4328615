"""The answers vLLM's clients parse, restated as pydantic models so the ported tests can
check our answers against them without installing vLLM (a GPU-sized dependency): the
fields and types of vLLM's response models (vllm-project/vllm,
vllm/entrypoints/pooling/scoring/protocol.py: RerankResponse, ScoreResponse;
vllm/entrypoints/pooling/classify/protocol.py: ClassificationResponse; UsageInfo of
vllm/entrypoints/openai/engine/protocol.py). Required fields are required here too, and
extra fields are allowed where vLLM's OpenAIBaseModel allows them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OpenAIBase(BaseModel):  # vLLM's OpenAIBaseModel keeps unknown fields
    model_config = ConfigDict(extra="allow")


class UsageInfo(OpenAIBase):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class RerankDocument(BaseModel):
    text: str | None = None
    multi_modal: list | None = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument  # required: a result without it (or null) is refused
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBase):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreResponseData(OpenAIBase):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(OpenAIBase):
    id: str = ""  # vLLM fills these two when absent
    object: str = "list"
    created: int = 0
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


class ClassificationData(OpenAIBase):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBase):
    id: str = ""
    object: str = "list"
    created: int = 0
    model: str
    data: list[ClassificationData]
    usage: UsageInfo
