"""OpenAI's /v1/decisions (openai 3.x `client.decisions.create`): the request and the
answer, and their conversion to and from a DecisionCall (plain Python, pydantic).

    {model, input: str | [message | function_call | function_call_output | ...],
     questions: 1-400 of {type: predicate | choice | score, instructions, name?, ...}}
 -> {object: "decision", model, answers: [one per question, in order], usage}

Extensions (extra_body for the openai client), none of which OpenAI's client sends:
`debias` ("none", "reverse", "cyclic": choice questions asked in other option orders too,
averaged), `calibrate` (divide out the content-free prior), `min_label_mass` (a question
whose options get less of the model's probability is answered with a refusal) and
`chat_template_kwargs`. Every answer also carries `label_mass`; a refusal its `reason`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictStr,
    Tag,
    field_validator,
)

from prefillonly_sgl.decisions.call import (
    DEBIAS_MODES,
    IMAGE_MARK,
    DecisionCall,
    DecisionOutcome,
    Message,
    Option,
    Question,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire.fields import cache_salt_field

MAX_QUESTIONS = 400
MAX_CHOICES = 255
MAX_LEVELS = 255


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Breakpoint(_Strict):
    mode: Literal["explicit"]


class InputText(_Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: Breakpoint | None = None  # the prefix cache is automatic here


class InputImage(_Strict):
    type: Literal["input_image"]
    image_url: str
    detail: Literal["low", "high", "auto", "original"] | None = None
    prompt_cache_breakpoint: Breakpoint | None = None


class InputJson(_Strict):
    type: Literal["input_json"]
    data: dict[str, Any] | list[dict[str, Any]]
    prompt_cache_breakpoint: Breakpoint | None = None


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[InputText | InputImage | InputJson, Field(discriminator="type")]
AssistantPart = Annotated[OutputText | RefusalPart, Field(discriminator="type")]


class UserMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user"]
    content: str | list[Part]


class InstructionMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["developer", "system"]
    content: str | list[InputText]


class AssistantMessage(_Strict):
    type: Literal["message"] = "message"
    role: Literal["assistant"]
    content: str | list[AssistantPart]
    phase: Literal["commentary", "final_answer"] | None = None


class ToolCall(_Strict):
    type: Literal["function_call", "custom_tool_call"]
    call_id: str
    name: str
    arguments: str | None = None  # function_call
    input: str | None = None  # custom_tool_call
    id: str | None = None
    namespace: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ToolOutput(_Strict):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[Annotated[InputText | InputImage, Field(discriminator="type")]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_kind(item: Any) -> str:
    if not isinstance(item, dict):
        return "message"
    kind = item.get("type", "message")
    if kind == "message":
        return {"user": "user", "assistant": "assistant"}.get(item.get("role"), "instruction")
    if kind in ("function_call", "custom_tool_call"):
        return "call"
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "output"
    return str(kind)


InputItem = Annotated[
    Annotated[UserMessage, Tag("user")]
    | Annotated[InstructionMessage, Tag("instruction")]
    | Annotated[AssistantMessage, Tag("assistant")]
    | Annotated[ToolCall, Tag("call")]
    | Annotated[ToolOutput, Tag("output")],
    Discriminator(_item_kind),
]
Instructions = str | list[Part]


class Predicate(_Strict):
    type: Literal["predicate"]
    instructions: Instructions
    name: str | None = None


class ChoiceValue(_Strict):
    value: StrictStr | StrictBool
    description: str | None = None


class Choice(_Strict):
    type: Literal["choice"]
    instructions: Instructions
    name: str | None = None
    choices: list[ChoiceValue] = Field(min_length=2, max_length=MAX_CHOICES)


class Level(_Strict):
    label: str
    description: str | None = None


class Score(_Strict):
    type: Literal["score"]
    instructions: Instructions
    name: str | None = None
    levels: list[Level] = Field(min_length=2, max_length=MAX_LEVELS)


QuestionIn = Annotated[Predicate | Choice | Score, Field(discriminator="type")]


class PromptCacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class DecisionsRequest(_Strict):
    model: str
    input: str | list[InputItem]
    questions: list[QuestionIn] = Field(min_length=1, max_length=MAX_QUESTIONS)
    prompt_cache_key: str | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: str | None = None
    # prefillonly extensions
    debias: Literal["none", "reverse", "cyclic"] = "none"
    calibrate: bool = False
    min_label_mass: float = Field(default=0.0, ge=0.0, le=1.0)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    cache_salt: str | None = cache_salt_field()

    @field_validator("debias", mode="before")
    @classmethod
    def _debias_known(cls, value):
        if value is not None and value not in DEBIAS_MODES:
            raise ValueError(f"must be one of {list(DEBIAS_MODES)}")
        return value


# -- answers ---------------------------------------------------------------------------
class PredicateAnswer(BaseModel):
    type: Literal["predicate"] = "predicate"
    name: str | None
    probability: float
    label_mass: float


class ChoiceProbability(BaseModel):
    value: StrictStr | StrictBool
    probability: float


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    name: str | None
    choice: StrictStr | StrictBool
    confidence: float
    probabilities: list[ChoiceProbability]
    label_mass: float


class ScoreProbability(BaseModel):
    value: int
    label: str
    probability: float


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    name: str | None
    score: float
    confidence: float
    probabilities: list[ScoreProbability]
    label_mass: float


class RefusalAnswer(BaseModel):
    type: Literal["refusal"] = "refusal"
    name: str | None
    reason: str


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class DecisionUsageOut(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class Decision(BaseModel):
    object: Literal["decision"] = "decision"
    model: str
    answers: list[PredicateAnswer | ChoiceAnswer | ScoreAnswer | RefusalAnswer]
    usage: DecisionUsageOut


# -- conversion --------------------------------------------------------------------------
def _text_of(content, where: str, images: list | None = None) -> str:
    """A content's text: strings as they are, JSON parts as compact JSON, one part per
    line; an image part is the line IMAGE_MARK with (where, its URL) added to ``images``
    (refused where ``images`` is None: a question's text, or a caller that reads none)."""
    if isinstance(content, str):
        return content
    lines = []
    for k, part in enumerate(content):
        if isinstance(part, InputText | OutputText):
            lines.append(part.text)
        elif isinstance(part, RefusalPart):
            lines.append(part.refusal)
        elif isinstance(part, InputJson):
            lines.append(json.dumps(part.data, ensure_ascii=False, separators=(",", ":")))
        elif images is not None:
            images.append((f"{where}[{k}]", part.image_url))
            lines.append(IMAGE_MARK)
        else:
            raise InvalidRequestError(
                f"{where}[{k}]: an image is read only in a request's input messages (the "
                "state), on a vision-language model"
            )
    return "\n".join(lines)


def messages_of(input_: str | list, images: list | None = None) -> tuple[Message, ...]:
    """The state's chat messages (developer messages are system messages; tool calls and
    their outputs are written as text in the assistant's and user's turns). images: where
    a user message's or a tool output's image parts are collected (their place in the
    text is IMAGE_MARK); None refuses them."""
    if isinstance(input_, str):
        return (Message("user", input_),)
    messages: list[Message] = []
    calls: set[str] = set()
    for i, item in enumerate(input_):
        where = f"input[{i}]"
        if isinstance(item, UserMessage):
            messages.append(Message("user", _text_of(item.content, f"{where}.content", images)))
        elif isinstance(item, InstructionMessage):
            messages.append(Message("system", _text_of(item.content, f"{where}.content")))
        elif isinstance(item, AssistantMessage):
            messages.append(Message("assistant", _text_of(item.content, f"{where}.content")))
        elif isinstance(item, ToolCall):
            calls.add(item.call_id)
            args = item.arguments if item.type == "function_call" else item.input
            messages.append(
                Message("assistant", f"[{item.type} {item.call_id}] {item.name}({args or ''})")
            )
        else:
            if item.call_id not in calls:
                raise InvalidRequestError(
                    f"{where}.call_id: {item.call_id!r} matches no earlier call in input"
                )
            output = _text_of(item.output, f"{where}.output", images)
            messages.append(Message("user", f"[{item.type} {item.call_id}] {output}"))
    return tuple(messages)


def _question(q: Predicate | Choice | Score, i: int) -> Question:
    where = f"questions[{i}]"
    instructions = _text_of(q.instructions, f"{where}.instructions")
    if not instructions.strip():
        raise InvalidRequestError(f"{where}.instructions: must not be empty")
    if isinstance(q, Predicate):
        options = (Option(True, "yes"), Option(False, "no"))
    elif isinstance(q, Choice):
        seen: dict[str, int] = {}
        options = []
        for k, c in enumerate(q.choices):
            text = ("true" if c.value else "false") if isinstance(c.value, bool) else c.value
            if not text.strip() or "\n" in text:
                raise InvalidRequestError(
                    f"{where}.choices[{k}].value: must be one line of text, got {text!r}"
                )
            key = text.strip().casefold()
            if key in seen:
                raise InvalidRequestError(
                    f"{where}.choices[{k}].value: {c.value!r} is written like choices"
                    f"[{seen[key]}] ({q.choices[seen[key]].value!r}): the model could not "
                    "tell them apart"
                )
            seen[key] = k
            options.append(Option(c.value, text, c.description))
        options = tuple(options)
    else:
        options = tuple(Option(k, lv.label, lv.description) for k, lv in enumerate(q.levels))
    return Question(q.type, instructions, options, name=q.name, where=where)


def to_call(request: DecisionsRequest) -> DecisionCall:
    """The call; its input's images (input_image parts) ride on it, read by the server on
    a vision-language model (sglang_runtime/decision_images.py) and refused elsewhere."""
    images: list = []
    messages = messages_of(request.input, images)
    return DecisionCall(
        messages=messages,
        images=tuple(images),
        questions=tuple(_question(q, i) for i, q in enumerate(request.questions)),
        wording="names",
        debias=request.debias,
        calibrate=request.calibrate,
        min_label_mass=request.min_label_mass,
        chat_template_kwargs=request.chat_template_kwargs,
    )


def to_response(model: str, outcome: DecisionOutcome) -> Decision:
    answers = []
    for r in outcome.results:
        q = r.question
        if r.refusal is not None:
            answers.append(RefusalAnswer(name=q.name, reason=r.refusal))
        elif q.kind == "predicate":
            answers.append(
                PredicateAnswer(
                    name=q.name, probability=r.probabilities[0], label_mass=r.label_mass
                )
            )
        elif q.kind == "choice":
            answers.append(
                ChoiceAnswer(
                    name=q.name,
                    choice=q.options[r.best].value,
                    confidence=r.confidence,
                    probabilities=[
                        ChoiceProbability(value=o.value, probability=p)
                        for o, p in zip(q.options, r.probabilities)
                    ],
                    label_mass=r.label_mass,
                )
            )
        else:
            answers.append(
                ScoreAnswer(
                    name=q.name,
                    score=r.expected_index,
                    confidence=r.confidence,
                    probabilities=[
                        ScoreProbability(value=o.value, label=o.text, probability=p)
                        for o, p in zip(q.options, r.probabilities)
                    ],
                    label_mass=r.label_mass,
                )
            )
    u = outcome.usage
    return Decision(
        model=model,
        answers=answers,
        usage=DecisionUsageOut(
            input_tokens=u.input_tokens,
            input_tokens_details=InputTokensDetails(
                cached_tokens=u.cached_tokens, cache_write_tokens=u.cache_write_tokens
            ),
            total_tokens=u.total_tokens,
        ),
    )
