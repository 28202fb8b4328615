"""A decision call as every front hands it to the compiler (plain Python, no wire format):
a state (chat messages) and typed questions about it, each question's options in order.

OpenAI's /v1/decisions, System One's /v1/systemone, SGLang's own /v1/decisions body and
the DSL's decision functions all become a DecisionCall (their wire modules convert), and
every answer comes back as a QuestionResult, which each wire module writes in its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from prefillonly_sgl.scoring.errors import InvalidRequestError

Kind = Literal["predicate", "choice", "score"]
Wording = Literal["names", "letters"]  # options answered by name (ours) or A-Z (SGLang v1)
Debias = Literal["none", "reverse", "cyclic"]
DEBIAS_MODES: tuple[str, ...] = ("none", "reverse", "cyclic")
# Where an image of the state goes in its messages' text (private-use characters: never
# in real text); the door serving the call puts the model's placeholder there
# (decisions/state_images.py), or refuses it on a model that reads text only.
IMAGE_MARK = "\ue001image\ue001"


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass(frozen=True)
class Option:
    value: object  # what the answer reports: a choice's str | bool, a level's index
    text: str  # how the option is named in the prompt (a choice's name, a level's label)
    description: str | None = None


@dataclass(frozen=True)
class Question:
    kind: Kind
    instructions: str  # "" when the question has no text of its own
    options: tuple[Option, ...]  # predicate: (yes, no); choice: the choices; score: levels
    name: str | None = None  # the caller's key (OpenAI's name, System One's id)
    where: str = "questions"  # the request field, for error messages ("questions[3]")


@dataclass(frozen=True)
class DecisionCall:
    messages: tuple[Message, ...]  # the state; the questions follow the last user message
    questions: tuple[Question, ...]
    wording: Wording = "names"
    debias: Debias = "none"  # option orders averaged (choice questions)
    calibrate: bool = False  # divide out the content-free prior (choice, score, predicate)
    temperature: float = 1.0  # on the options' log-probabilities (SGLang's field)
    min_label_mass: float = 0.0  # below it a question is answered with a refusal
    chat_template_kwargs: dict = field(default_factory=dict)
    # The state's images, in the order of their IMAGE_MARKs: (where in the body, a URL,
    # data URL or {"url": ...}), loaded by the door that reads them.
    images: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        # The answer is read at the first token the model writes: a thinking template
        # would put its opening tag there (SGLang's and vLLM's decision routes refuse it).
        if self.chat_template_kwargs.get("enable_thinking") is True:
            raise InvalidRequestError(
                "chat_template_kwargs.enable_thinking: thinking must be off for a decision "
                "(the answer is read at the first token the model writes)"
            )


@dataclass(frozen=True)
class QuestionResult:
    """One question's answer, before any wire format."""

    question: Question
    probabilities: tuple[float, ...]  # per option, in the question's order; sum 1
    label_mass: float  # the options' share of the model's whole next-text distribution
    confidence: float
    refusal: str | None = None  # why the question is answered with a refusal
    prompt_token_ids: tuple[int, ...] = ()  # the question's prompt as scored (order as given)
    label_token_ids: tuple = ()  # per option its label's token ids in that prompt

    @property
    def best(self) -> int:
        return max(range(len(self.probabilities)), key=self.probabilities.__getitem__)

    @property
    def expected_index(self) -> float:
        return sum(i * p for i, p in enumerate(self.probabilities))


@dataclass(frozen=True)
class DecisionUsage:
    input_tokens: int  # every prompt token sent (all questions, orders and priors)
    cached_tokens: int  # of those, served from the prefix cache
    cache_write_tokens: int  # state tokens this call computed and left in the cache
    prompts: int  # prompts scored

    @property
    def total_tokens(self) -> int:
        return self.input_tokens


@dataclass(frozen=True)
class DecisionOutcome:
    results: tuple[QuestionResult, ...]
    usage: DecisionUsage
