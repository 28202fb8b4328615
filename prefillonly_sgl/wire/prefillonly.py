"""prefillonly serve's own bodies (plain Python and pydantic), declared once for the
server and its clients:

- ScoreUsage: the `usage` of /v1/score's answer (SGLang's fields with the cached tokens
  always filled, plus queue and running time). Written by score_usage (below), read by
  the DSL's RemoteBackend, which also reads a stock SGLang server's (hence SGLang's
  defaults).
- ScoreLabelsRequest / ScoreLabelsResponse (usage: ScoreLabelsUsage): /v1/score_labels.
  Served by apis/score_labels.py; posted by RemoteBackend for labels of several tokens.
- Usage: the `usage` of /v1/rerank, /v2/rerank, /rerank and /v1/classify.
- score_usage, score_labels_usage, api_usage: a request's usage record
  (scoring/usage.py) in each of those shapes.
"""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from prefillonly_sgl.scoring.labels import LabelIds
from prefillonly_sgl.scoring.usage import RequestUsage
from prefillonly_sgl.wire.fields import cache_salt_field

# -- /v1/score's usage ------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class ScoreUsage(BaseModel):
    """/v1/score's `usage` on prefillonly serve: SGLang's own fields (merged in by the
    server; a client ignores the ones it does not read) and these."""

    prompt_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None  # None: a stock SGLang's
    queue_time: float | None = None
    running_time: float | None = None

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return details.cached_tokens if details is not None else 0


# -- /v1/score_labels -------------------------------------------------------------------


class ScoreLabelsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field("", description="text before each item (may be empty)")
    items: list[str] = Field(..., min_length=1, description="texts appended to the query")
    labels: list[str] | None = Field(
        None, min_length=1, description="candidate next words, written verbatim (any length)"
    )
    label_token_ids: list[LabelIds] | None = Field(
        None,
        min_length=1,
        description="instead of labels: per label a token id or a list of token ids",
    )
    apply_softmax: bool = Field(
        True, description="normalise over the labels (false: probability over the vocabulary)"
    )
    length_normalize: bool = Field(
        False, description="a label's per-token (geometric mean) probability, not the product"
    )
    temperature: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="with apply_softmax: the softmax over the labels of their log-probabilities "
        "divided by it (SGLang's /v1/score temperature, for labels of any length)",
    )
    item_first: bool = Field(False, description="item before query instead of after")
    cache_salt: str | None = cache_salt_field()
    image_data: str | list[str] | None = Field(
        None,
        description="a vision-language model: the query's images (URLs or data URLs), "
        "shared by every item (docs/images.md)",
    )
    item_image_data: list[list[str]] | None = Field(
        None, description="per item, its own images (URLs or data URLs)"
    )

    @model_validator(mode="after")
    def _one_kind_of_labels(self):
        if (self.labels is None) == (self.label_token_ids is None):
            raise ValueError("give exactly one of labels (words) and label_token_ids")
        return self


class ScoreLabelsUsage(BaseModel):
    prompt_tokens: int
    cached_tokens: int
    queue_time: float | None = None
    running_time: float | None = None


class ScoreLabelsResponse(BaseModel):
    scores: list[dict[str, float]] = Field(..., description="per item: label -> probability")
    rows: list[list[float]] = Field(..., description="per item: the scores in label order")
    usage: ScoreLabelsUsage | None = None


# -- /v1/rerank and /v1/classify --------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0


# -- the usage record's views (scoring/usage.py) ------------------------------------------


def score_usage(usage: RequestUsage) -> dict:
    """The fields added to /v1/score's usage (wire.ScoreUsage: OpenAI-style names where
    they exist)."""
    return ScoreUsage(
        prompt_tokens=usage.prompt_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        queue_time=usage.queue_time,
        running_time=usage.running_time,
    ).model_dump()


def score_labels_usage(usage: RequestUsage) -> ScoreLabelsUsage:
    return ScoreLabelsUsage(
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        queue_time=usage.queue_time,
        running_time=usage.running_time,
    )


def api_usage(usage: RequestUsage) -> Usage:
    """The ranking and classify APIs' `usage` (prompt tokens are all there is)."""
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        total_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
    )
