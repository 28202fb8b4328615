"""The JSON contracts that `prefillonly serve` and its clients share (plain Python and
pydantic, no SGLang): every body one side writes and the other reads is declared once,
here, and both sides import it. A DSL function's own typed endpoints follow the same
rule with models built per function (dsl/app_models.py).

- LabelIds: one label's token ids: an id, or a tuple of ids for a label of several tokens
  (a JSON list). What the DSL compiles (labels.py, dsl/request.py) and
  /v1/score_labels takes.
- ScoreUsage: the `usage` of prefillonly serve's /v1/score answer (SGLang's fields with
  the cached tokens always filled, plus queue and running time). Written by
  usage.RequestUsage.as_dict, read by the DSL's RemoteBackend, which also reads a stock
  SGLang server's (hence SGLang's defaults).
- ScoreLabelsRequest / ScoreLabelsResponse (usage: ScoreLabelsUsage): /v1/score_labels.
  Served by apis/score_labels.py; posted by RemoteBackend for labels of several tokens.
- RerankRequest / RerankAnswer and ClassifyRequest / ClassifyResponse (usage: Usage):
  /v1/rerank and /v1/classify. Served by apis/rerank.py and apis/ranking.py; posted by
  the DSL's gateway client (dsl/gateway_client.py) through SGLang's gateway. RerankMeta
  is the meta_info of each entry of SGLang's native rerank answer (what the gateway
  parses and passes through): the ranker, its method and labels, the document's row
  (label probabilities, or a likelihood ranker's token logprobs), the call's tokens.
  Cohere's v2 and TEI's shapes: rerank_wire.py.
- classify_parameter: which classifiers /v1/classify carries (one text per input, so one
  parameter without a default); checked by `serve --classify` and by the gateway client.
- request_body: a request model's JSON body as a client sends it (checked, fields given
  only), so a client's request is what the server's model reads.
- cache_salt_field: the `cache_salt` every scoring request body carries (these models, the
  decisions' and rerank_wire's, the typed endpoints' of dsl/app_models.py): the request's
  prefix-cache namespace (cache_salts.py; docs/server.md, "Tenants").
"""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from prefillonly_sgl.cache_salts import MAX_SALT_CHARS
from prefillonly_sgl.errors import InvalidRequestError

CACHE_SALT_DESCRIPTION = (
    "the request's prefix-cache namespace: it reuses, and reports as cached, only "
    "prefixes cached under the same salt (on a server with --tenant-keys, within its "
    "tenant's)"
)


def cache_salt_field():
    """The `cache_salt` field of a request body (SGLang's name, as its chat and
    completions requests carry it)."""
    return Field(None, max_length=MAX_SALT_CHARS, description=CACHE_SALT_DESCRIPTION)


LabelIds = int | tuple[int, ...]
"""One label's token ids: its id, or its ids when it is several tokens (JSON: a list)."""


def request_body(request_model: type[BaseModel], /, **fields) -> dict:
    """The JSON body a client sends: ``fields`` checked against ``request_model``
    (InvalidRequestError, as the server's 400 would be, if they do not fit) and written as
    given (fields not given stay out)."""
    try:
        body = request_model(**fields)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in e.errors()
        )
        raise InvalidRequestError(f"invalid {request_model.__name__}: {problems}") from None
    return body.model_dump(mode="json", exclude_unset=True)


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
    item_first: bool = Field(False, description="item before query instead of after")
    cache_salt: str | None = cache_salt_field()

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


class RerankDocument(BaseModel):
    text: str


class RerankRequest(BaseModel):
    # Clients send fields of their providers (rank_fields, max_tokens_per_doc, ...):
    # ignored rather than refused, so a Cohere-style request works unchanged.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: str = Field(..., min_length=1, description="what the documents are ranked for")
    documents: list[str | RerankDocument] = Field(
        ..., min_length=1, description="texts (or {'text': ...}) to rank"
    )
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


class RerankMeta(BaseModel):
    """meta_info of an entry of SGLang's native rerank answer: which ranker answered (the
    DSL's gateway client checks it is the one it calls), the document's label
    probabilities (its row) and the whole call's tokens."""

    function: str
    labels: list[str]
    call_prompt_tokens: int
    call_cached_tokens: int
    probs: list[float]  # in the order of labels ([] for a likelihood ranker)
    method: str = "labels"  # the ranker's DSL method: "labels" or "likelihood"
    token_logprobs: list[float] | None = None  # a likelihood ranker's row


class SGLangRerankResult(BaseModel):
    """One entry of SGLang's native /v1/rerank answer (what smg parses)."""

    score: float
    document: str | None = None
    index: int
    meta_info: RerankMeta


class RerankAnswer(RootModel[RerankResponse | list[SGLangRerankResult]]):
    """Cohere's answer, or SGLang's native list for requests carrying ``rid``."""


class ClassifyRequest(BaseModel):
    """SGLang's / vLLM's classify request: ``input`` (texts or token ids; token ids are
    decoded to the text the classifier's prompt takes) or ``messages`` (a chat, rendered
    with the model's chat template into that text), and vLLM's extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = Field(
        None, description="a text, a list of texts, token ids or lists of token ids"
    )
    messages: list[dict] | None = Field(
        None, description="a chat, rendered with the chat template (instead of input)"
    )
    add_generation_prompt: bool = Field(False, description="messages: the assistant's turn opened")
    continue_final_message: bool = Field(False, description="messages: the last message left open")
    add_special_tokens: bool | None = Field(
        None, description="vLLM's; accepted (the classifier's prompt decides its special tokens)"
    )
    chat_template_kwargs: dict | None = Field(None, description="messages: for the template")
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="vLLM's: cut each input to N tokens (-1: as many as fit)"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="vLLM's: right (default) keeps the first N tokens, left the last N"
    )
    use_activation: bool | None = Field(
        None, description="vLLM's: false gives the labels' log-probabilities, before the softmax"
    )
    cache_salt: str | None = cache_salt_field()

    @model_validator(mode="after")
    def _one_input(self):
        if (self.input is None) == (self.messages is None):
            raise ValueError("give input (texts or token ids) or messages (a chat), one of them")
        if self.continue_final_message and self.add_generation_prompt:
            # vLLM's wording, which its clients and tests look for.
            raise ValueError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
            )
        return self


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: Usage
    function: str = Field(description="the DSL classifier that answered (its probs' order: labels)")
    labels: list[str]


def classify_parameter(function) -> str:
    """The parameter of a DSL classifier that /v1/classify's text fills: the request
    carries one text per input, so the classifier must have exactly one parameter without
    a default. ValueError naming the required ones otherwise."""
    required = [
        p.name for p in function.inputs.signature.parameters.values() if p.default is p.empty
    ]
    if len(required) != 1:
        raise ValueError(
            f"/v1/classify gives one input text, but the classifier requires {required} "
            "(one parameter; give the others defaults)"
        )
    return required[0]
