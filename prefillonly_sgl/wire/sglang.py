"""SGLang's own /v1/decisions body (its protocol.DecisionRequest, prompt wording version
1) and answer, accepted on the same path as OpenAI's (plain Python, pydantic).

    {input, questions: [{id, type: choice | score | yes_no, question, options | levels |
     yes/no}], temperature?, chat_template_kwargs?, prompt_format_version?,
     return_prompt_token_ids?, model?}
 -> {object: "decisions", model, prompt_format_version: 1,
     answers: {id: {type, probabilities: {name: p}, label_mass, choice | score,
                    prompt_token_ids?, label_token_ids?}}, usage}

Its prompts are SGLang's (the same wording and A-Z labels: decisions/prompts.py), so an
answer is what stock SGLang computes, but behind one computed state, and without SGLang's
limits of one token per label: more than 26 options get SGLang's two-letter labels
(AA, AB, ...), a scale more than 10 levels, scored by the chain rule.

Which shape a /v1/decisions body is: SGLang's when a question carries `id` or `question`
(SGLang's names), or the body `temperature`, `images`, `prompt_format_version` or
`return_prompt_token_ids`; OpenAI's otherwise (is_sglang_body). Its `images` (URLs, data
URLs or {"url": ...}) go before the input's text, as SGLang's handler writes its user
message, and are read on a vision-language model (docs/images.md).
"""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    field_validator,
    model_validator,
)

from prefillonly_sgl.decisions.call import (
    IMAGE_MARK,
    DecisionCall,
    DecisionOutcome,
    Message,
    Option,
    Question,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire.cohere import RerankResponse
from prefillonly_sgl.wire.fields import cache_salt_field
from prefillonly_sgl.wire.prefillonly import Usage

PROMPT_FORMAT_VERSION = 1
MAX_OPTIONS = 255
MAX_LEVELS = 255
_SGLANG_ONLY = ("temperature", "images", "prompt_format_version", "return_prompt_token_ids")

Text = str | dict[str, Any] | list[Any]  # objects and arrays are rendered as compact JSON


def render_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _not_blank(value):
    if not (value.strip() if isinstance(value, str) else value):
        raise ValueError("must not be blank")
    return value


RequiredText = Annotated[Text, AfterValidator(_not_blank)]


def check_option_names(names) -> None:
    """SGLang's rule: names one line each, distinct ignoring case and outer spaces."""
    seen = set()
    for name in names:
        key = name.strip().casefold()
        if not key:
            raise ValueError("option names must be nonempty")
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in name):
            raise ValueError(
                f"option name {name!r} must not contain control or line break characters"
            )
        if key in seen:
            raise ValueError(f"option name {name!r} repeats another option")
        seen.add(key)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SGLangOption(_Strict):
    name: str
    description: Text | None = None


class SGLangChoice(_Strict):
    id: Annotated[str, AfterValidator(_not_blank)]
    type: Literal["choice"]
    question: RequiredText
    options: list[SGLangOption] = Field(min_length=2, max_length=MAX_OPTIONS)

    @model_validator(mode="after")
    def _names(self):
        check_option_names(o.name for o in self.options)
        return self


class SGLangScore(_Strict):
    id: Annotated[str, AfterValidator(_not_blank)]
    type: Literal["score"]
    question: RequiredText
    levels: list[RequiredText] = Field(min_length=2, max_length=MAX_LEVELS)


class SGLangYesNo(_Strict):
    id: Annotated[str, AfterValidator(_not_blank)]
    type: Literal["yes_no"]
    question: RequiredText
    yes: Text | None = None
    no: Text | None = None


class SGLangDecisionRequest(_Strict):
    input: RequiredText
    images: list[Any] = Field(default_factory=list)
    questions: list[
        Annotated[SGLangChoice | SGLangScore | SGLangYesNo, Field(discriminator="type")]
    ] = Field(min_length=1, max_length=400)
    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    prompt_format_version: int | None = None
    cache_salt: str | None = cache_salt_field()  # ours
    return_prompt_token_ids: bool = False
    model: str = "default"
    # prefillonly extensions (as on OpenAI's shape)
    debias: Literal["none", "reverse", "cyclic"] = "none"
    calibrate: bool = False

    @field_validator("questions")
    @classmethod
    def _ids_distinct(cls, questions):
        seen = set()
        for q in questions:
            if q.id in seen:
                raise ValueError(f"question id {q.id!r} repeats another question")
            seen.add(q.id)
        return questions

    @field_validator("prompt_format_version")
    @classmethod
    def _version_served(cls, version):
        if version is not None and version != PROMPT_FORMAT_VERSION:
            raise ValueError(
                f"prompt_format_version {version} is not served, this server uses version "
                f"{PROMPT_FORMAT_VERSION}"
            )
        return version


def is_sglang_body(body: object) -> bool:
    if not isinstance(body, dict):
        return False
    if any(key in body for key in _SGLANG_ONLY):
        return True
    questions = body.get("questions")
    return isinstance(questions, list) and any(
        isinstance(q, dict) and ("id" in q or "question" in q or q.get("type") == "yes_no")
        for q in questions
    )


def to_call(request: SGLangDecisionRequest) -> DecisionCall:
    questions = []
    for i, q in enumerate(request.questions):
        where = f"questions[{i}]"
        text = render_text(q.question)
        if isinstance(q, SGLangChoice):
            options = tuple(
                Option(o.name, o.name, render_text(o.description) or None) for o in q.options
            )
            questions.append(Question("choice", text, options, name=q.id, where=where))
        elif isinstance(q, SGLangScore):
            options = tuple(Option(k, render_text(level)) for k, level in enumerate(q.levels))
            questions.append(Question("score", text, options, name=q.id, where=where))
        else:
            options = (
                Option("yes", "yes", render_text(q.yes) or None),
                Option("no", "no", render_text(q.no) or None),
            )
            questions.append(Question("predicate", text, options, name=q.id, where=where))
    images = tuple((f"images[{k}]", image) for k, image in enumerate(request.images))
    return DecisionCall(
        # the images before the input's text, as SGLang's handler writes its user message
        messages=(Message("user", IMAGE_MARK * len(images) + render_text(request.input)),),
        images=images,
        questions=tuple(questions),
        wording="letters",
        debias=request.debias,
        calibrate=request.calibrate,
        temperature=request.temperature,
        chat_template_kwargs=request.chat_template_kwargs,
    )


def _ids(label: tuple[int, ...]):
    return label[0] if len(label) == 1 else list(label)


def to_response(request: SGLangDecisionRequest, outcome: DecisionOutcome) -> dict:
    answers = {}
    for q, r in zip(request.questions, outcome.results):
        if r.refusal is not None:
            raise InvalidRequestError(f"question {q.id!r}: {r.refusal}")
        question = r.question
        if question.kind == "score":
            names = [str(k) for k in range(len(question.options))]
        else:
            names = [o.text for o in question.options]
        answer = {
            "type": q.type,
            "probabilities": dict(zip(names, r.probabilities)),
            "label_mass": r.label_mass,
        }
        if question.kind == "choice":
            answer["choice"] = names[r.best]
        elif question.kind == "score":
            answer["score"] = r.expected_index
        if request.return_prompt_token_ids:
            answer["prompt_token_ids"] = list(r.prompt_token_ids)
            answer["label_token_ids"] = [_ids(label) for label in r.label_token_ids]
        answers[q.id] = answer
    u = outcome.usage
    return {
        "object": "decisions",
        "model": request.model,
        "prompt_format_version": PROMPT_FORMAT_VERSION,
        "answers": answers,
        "usage": {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": 0,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        },
    }


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
