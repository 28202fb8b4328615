"""System One's /v1/systemone (typesafe-sdk's `TypeSafeClient.system_one`, the clients
of LiteLLM, LangChain, Spring AI, Genkit, LiveKit, Ollama): request, answer, and their
conversion (plain Python, pydantic).

    {model, state: str | object | array, questions: {id: noul | choice | score}}
 -> {model, answers: {id: {type: noul, noul} | {type: choice, choice, confidence,
     probabilities: {name: p}} | {type: score, score, confidence, legend: {"0": level},
     probabilities: {"0": p}}}, usage: {input_tokens, output_tokens}}

Every answer also carries `x_label_mass` (SGLang's extension name). With vLLM's
conventions (`serve --systemone-conventions vllm`, for clients of vLLM's /v1/systemone):
`object: "structured_decision"`, `diagnostics: {id: {label_mass}}`, a noul's
`probabilities` and `confidence`, confidence as vLLM computes it (the top option's
probability times the label mass), `usage.output_tokens` one per question (vLLM runs one
1-token request per question), and vLLM's limits (64 questions, 26 options). A question that
cannot be answered (its prompt past the context, or under `min_label_mass`) is answered
`{type: "refusal", reason}`, which System One's client skips (it ignores answer types it
does not know) while keeping the others. On a vision-language model the state's images
are read: `images` (SGLang's extension: URLs, data URLs or {"url": ...}), before the
state's text, as SGLang's handler writes them; elsewhere they are refused. System One's
own `assets` (images sent as multipart parts or base64, placed where the state names
them) are refused with a 400 saying so: their parts and references are not read yet. Box
questions (locating things in an image) are refused with a 400 naming the question: their
answer is coordinates the model writes, not a choice among labels.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefillonly_sgl.decisions.call import (
    IMAGE_MARK,
    DecisionCall,
    DecisionOutcome,
    Message,
    Option,
    Question,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire.fields import cache_salt_field
from prefillonly_sgl.wire.sglang import check_option_names, render_text

MAX_QUESTIONS = 400
MAX_OPTIONS = 255
MAX_LEVELS = 255
VLLM_MAX_QUESTIONS = 64
VLLM_MAX_OPTIONS = 26
Text = str | dict[str, Any] | list[Any]


class _Question(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelled key would ask something else
    instructions: Text | None = None


class NoulCriteria(BaseModel):
    model_config = ConfigDict(extra="forbid")
    true: Text | None = None
    false: Text | None = None


class Noul(_Question):
    type: Literal["noul"]
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _asks_something(self):
        criteria = self.criteria or NoulCriteria()
        if not any(
            render_text(v).strip() for v in (self.instructions, criteria.true, criteria.false)
        ):
            raise ValueError("a noul question needs instructions or a true or false description")
        return self


class Choice(_Question):
    type: Literal["choice"]
    criteria: dict[str, Text | None] = Field(min_length=1, max_length=MAX_OPTIONS)

    @field_validator("criteria")
    @classmethod
    def _names(cls, criteria):
        check_option_names(criteria)
        return criteria


class Score(_Question):
    type: Literal["score"]
    criteria: list[Text] = Field(max_length=MAX_LEVELS)

    @field_validator("criteria")
    @classmethod
    def _levels(cls, criteria):
        if len(criteria) < 2:
            raise ValueError("criteria must be an ordered list of levels, at least 2")
        return criteria


class Box(_Question):
    type: Literal["box"]


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown top-level fields: ignored, as published
    model: str
    state: Text
    questions: dict[str, Annotated[Noul | Choice | Score | Box, Field(discriminator="type")]] = (
        Field(min_length=1, max_length=MAX_QUESTIONS)
    )
    assets: dict[str, Any] | None = None
    images: list[Any] = Field(default_factory=list)  # SGLang's extension
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # prefillonly extensions
    debias: Literal["none", "reverse", "cyclic"] = "none"
    calibrate: bool = False
    min_label_mass: float = Field(default=0.0, ge=0.0, le=1.0)
    cache_salt: str | None = cache_salt_field()


class SystemOneResponse(BaseModel):
    """The answer (documentation only: each answer's fields are listed above)."""

    model: str
    answers: dict[str, dict[str, Any]]
    usage: dict[str, int]


def to_call(request: SystemOneRequest, conventions: str = "systemone") -> DecisionCall:
    if conventions == "vllm":
        _check_vllm_limits(request)
    questions = []
    for qid, q in request.questions.items():
        where = f"questions.{qid}"
        text = render_text(q.instructions)
        if isinstance(q, Box):
            raise InvalidRequestError(
                f"{where}: box questions locate things in an image: their answer is "
                "coordinates the model writes, which a prefill-only scorer does not decode"
            )
        if isinstance(q, Noul):
            c = q.criteria or NoulCriteria()
            options = (
                Option(True, "yes", render_text(c.true) or None),
                Option(False, "no", render_text(c.false) or None),
            )
            questions.append(Question("predicate", text, options, name=qid, where=where))
        elif isinstance(q, Choice):
            options = tuple(
                Option(name, name, render_text(d) or None) for name, d in q.criteria.items()
            )
            questions.append(Question("choice", text, options, name=qid, where=where))
        else:
            options = tuple(Option(k, render_text(level)) for k, level in enumerate(q.criteria))
            questions.append(Question("score", text, options, name=qid, where=where))
    images = state_images(request)
    return DecisionCall(
        messages=(Message("user", IMAGE_MARK * len(images) + render_text(request.state)),),
        images=images,
        questions=tuple(questions),
        wording="names",
        debias=request.debias,
        calibrate=request.calibrate,
        min_label_mass=request.min_label_mass,
        chat_template_kwargs=request.chat_template_kwargs,
    )


ASSETS_REFUSAL = (
    "assets: System One's image assets (multipart parts or base64, placed where the state "
    "names them) are not read yet; give the state's images in `images` (SGLang's "
    "extension: URLs or data URLs, read before the state's text on a vision-language model)"
)


def state_images(request: SystemOneRequest) -> tuple[tuple[str, Any], ...]:
    """The state's images as (where, image), from `images`; `assets` refused."""
    if request.assets:
        raise InvalidRequestError(ASSETS_REFUSAL)
    return tuple((f"images[{k}]", image) for k, image in enumerate(request.images))


def _check_vllm_limits(request: SystemOneRequest) -> None:
    if len(request.questions) > VLLM_MAX_QUESTIONS:
        raise InvalidRequestError(
            f"questions: at most {VLLM_MAX_QUESTIONS} questions per request (vLLM's limit, "
            f"kept by --systemone-conventions vllm), got {len(request.questions)}"
        )
    for qid, q in request.questions.items():
        if isinstance(q, Choice) and len(q.criteria) > VLLM_MAX_OPTIONS:
            raise InvalidRequestError(
                f"questions.{qid}.criteria: at most {VLLM_MAX_OPTIONS} options (vLLM's "
                f"limit, kept by --systemone-conventions vllm), got {len(q.criteria)}"
            )


def to_response(
    model: str,
    outcome: DecisionOutcome,
    request: SystemOneRequest | None = None,
    conventions: str = "systemone",
) -> dict:
    """The answer; a score's legend holds the request's own levels (JSON kept as sent)."""
    if conventions == "vllm":
        return _vllm_response(model, outcome, request)
    answers = {}
    for r in outcome.results:
        q = r.question
        if r.refusal is not None:
            answers[q.name] = {"type": "refusal", "reason": r.refusal}
        elif q.kind == "predicate":
            answers[q.name] = {
                "type": "noul",
                "noul": r.probabilities[0],
                "x_label_mass": r.label_mass,
            }
        elif q.kind == "choice":
            answers[q.name] = {
                "type": "choice",
                "choice": q.options[r.best].text,
                "confidence": r.confidence,
                "probabilities": {o.text: p for o, p in zip(q.options, r.probabilities)},
                "x_label_mass": r.label_mass,
            }
        else:
            asked = request.questions.get(q.name) if request is not None else None
            original = asked.criteria if asked is not None else [o.text for o in q.options]
            answers[q.name] = {
                "type": "score",
                "score": r.expected_index,
                "confidence": r.confidence,
                "legend": {str(k): level for k, level in enumerate(original)},
                "probabilities": {str(k): p for k, p in enumerate(r.probabilities)},
                "x_label_mass": r.label_mass,
            }
    return {
        "model": model,
        "answers": answers,
        "usage": {"input_tokens": outcome.usage.input_tokens, "output_tokens": 0},
    }


def _vllm_response(model: str, outcome: DecisionOutcome, request) -> dict:
    """System One's answer with vLLM's fields and confidence (see the module doc)."""
    body = to_response(model, outcome, request)
    answered = [r for r in outcome.results if r.refusal is None]
    for r in answered:
        answer = body["answers"][r.question.name]
        confidence = max(r.probabilities) * r.label_mass
        if r.question.kind == "predicate":
            answer["probabilities"] = {"yes": r.probabilities[0], "no": r.probabilities[1]}
        answer["confidence"] = confidence
    return {
        "object": "structured_decision",
        **body,
        "diagnostics": {r.question.name: {"label_mass": r.label_mass} for r in answered},
        "usage": {**body["usage"], "output_tokens": len(answered)},
    }
