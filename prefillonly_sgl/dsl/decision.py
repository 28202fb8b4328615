"""``@decision``: a typed Python function whose return model's fields are the questions
(plain Python; where it runs is passed in).

    from typing import Annotated, Literal
    from pydantic import BaseModel, Field
    import prefillonly_sgl as prefillonly

    class Triage(BaseModel):
        billing: bool = Field(description="Is the ticket about billing?")
        team: Literal["billing", "technical support", "sales"] = Field(
            description="Which team should handle the ticket?")
        urgency: Annotated[int, prefillonly.Scale("low", "normal", "urgent")] = Field(
            description="How urgent is the ticket?")

    @prefillonly.decision
    def triage(ticket: str) -> Triage:
        return f"Support ticket:\\n{ticket}"      # the state: text, or chat messages

    d = triage("I was charged twice", engine=engine)
    d.value                      # Triage(billing=True, team='billing', urgency=2)
    d.answers["team"].probabilities   # {'billing': 0.81, 'technical support': 0.12, ...}

Each field is a question, its description the instructions: ``bool`` a yes/no question
(the value: p(yes) >= 0.5), ``Literal[...]`` (str or bool values) or an ``Enum`` one of
N options (``Options(...)`` in ``Annotated`` describes them), ``Annotated[int | str,
Scale(levels...)]`` a level on a scale (the value: the most probable level's index or
label). Every question of a call is asked behind the one state.

Where it runs (``engine=``, else the DSL's default from ``prefillonly.use``): an Engine
(Engine.decide's path), our server or any server of OpenAI's /v1/decisions (a URL, or
``DecisionServer(url, protocol="openai")``), or any System One server
(``DecisionServer(url, protocol="systemone", api_key=...)``). Under ``prefillonly serve
--app FILE`` the function is served too: POST /decisions/<name> takes its arguments, and
/v1/decisions and /v1/systemone answer its questions for ``"model": "<name>"`` when the
request brings no questions of its own (the function renders the state from ``input``).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from prefillonly_sgl.decisions.call import (
    DecisionCall,
    DecisionOutcome,
    Message,
    Option,
    Question,
    QuestionResult,
)
from prefillonly_sgl.dsl.signature import DeclarationError, Signature, type_hints
from prefillonly_sgl.scoring.adapters import check_lora_path
from prefillonly_sgl.scoring.errors import InvalidRequestError

RESERVED = ("engine",)


class Scale:
    """Marks a field as a level on a scale: ``Annotated[int, Scale("low", "high")]`` (the
    value: the most probable level's index; with ``str``, its label). ``descriptions``:
    per level label, a description written after it."""

    def __init__(self, *levels: str, descriptions: dict[str, str] | None = None) -> None:
        if len(levels) < 2 or not all(isinstance(x, str) and x.strip() for x in levels):
            raise DeclarationError(f"Scale needs two or more level labels, got {levels!r}")
        self.levels = levels
        self.descriptions = descriptions or {}


class Options:
    """Describes a choice's options: ``Annotated[Literal["a", "b"], Options(a="...")]``."""

    def __init__(self, **descriptions: str) -> None:
        self.descriptions = descriptions


@dataclass(frozen=True)
class FieldQuestion:
    name: str
    question: Question
    kind: str  # "bool", "choice", "scale-index", "scale-label"


@dataclass(frozen=True)
class FieldAnswer:
    """One field's answer: every option's probability (keyed by the field's values)."""

    value: object
    probabilities: dict
    confidence: float
    label_mass: float
    refusal: str | None = None


@dataclass(frozen=True)
class Decided:
    value: BaseModel  # the model with each field's most probable answer
    answers: dict[str, FieldAnswer]
    usage: dict = field(default_factory=dict)


def questions_of(model: type[BaseModel]) -> list[FieldQuestion]:
    """The questions a return model's fields ask (DeclarationError naming a field that
    cannot be one)."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise DeclarationError(
            f"a decision function returns the state and is annotated with a pydantic model "
            f"whose fields are the questions (-> MyAnswers), got {model!r}"
        )
    out = []
    for name, info in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        if not (info.description and info.description.strip()):
            raise DeclarationError(f'{where}: give the question as Field(description="...")')
        annotation, metadata = info.annotation, list(info.metadata)
        if typing.get_origin(annotation) is typing.Annotated:
            annotation, *more = typing.get_args(annotation)
            metadata += more
        scale = next((m for m in metadata if isinstance(m, Scale)), None)
        described = next((m for m in metadata if isinstance(m, Options)), None)
        notes = described.descriptions if described else {}
        if scale is not None:
            if annotation not in (int, str):
                raise DeclarationError(
                    f"{where}: a Scale field is int (the level) or str (its label)"
                )
            options = tuple(
                Option(k, level, scale.descriptions.get(level))
                for k, level in enumerate(scale.levels)
            )
            kind = "scale-index" if annotation is int else "scale-label"
            question = Question("score", info.description, options, name=name, where=where)
        elif annotation is bool:
            options = (Option(True, "yes"), Option(False, "no"))
            kind, question = (
                "bool",
                Question("predicate", info.description, options, name=name, where=where),
            )
        else:
            values = _choice_values(annotation, where)
            options = tuple(Option(v, _text(v), notes.get(_text(v))) for v in values)
            kind, question = (
                "choice",
                Question("choice", info.description, options, name=name, where=where),
            )
        out.append(FieldQuestion(name, question, kind))
    if not out:
        raise DeclarationError(f"{model.__name__} has no fields: nothing to ask")
    return out


def _choice_values(annotation, where: str) -> tuple:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        values = typing.get_args(annotation)
        if len(values) >= 2 and all(isinstance(v, str | bool) for v in values):
            return values
    raise DeclarationError(
        f"{where}: a question is bool (yes/no), Literal[...] of str or bool values or an Enum "
        f"(one of N), or Annotated[int | str, Scale(...)] (a level); got {annotation!r}"
    )


def _text(value) -> str:
    if isinstance(value, enum.Enum):
        plain = value.value
        return (
            str(plain)
            if isinstance(plain, str | int) and not isinstance(plain, bool)
            else value.name
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def messages_of(state) -> tuple[Message, ...]:
    """A decision function's return: text (the user's message) or chat messages
    ({"role", "content"} dicts)."""
    if isinstance(state, str):
        return (Message("user", state),)
    if isinstance(state, Sequence) and state and all(isinstance(m, dict) for m in state):
        roles = {
            "user": "user",
            "system": "system",
            "developer": "system",
            "assistant": "assistant",
        }
        out = []
        for i, m in enumerate(state):
            role, content = roles.get(m.get("role")), m.get("content")
            if role is None or not isinstance(content, str):
                raise InvalidRequestError(
                    f"message {i}: give role (user, system, developer, assistant) and text content"
                )
            out.append(Message(role, content))
        return tuple(out)
    raise InvalidRequestError(
        f"a decision function returns its state as text or a list of chat messages, got {state!r}"
    )


class DecisionFunction:
    """What ``@decision`` makes of a function: call it (``engine=``) for one decision,
    ``batch`` for many; ``call(...)`` builds the DecisionCall without running it."""

    def __init__(
        self,
        fn,
        *,
        debias: str = "none",
        calibrate: bool = False,
        path: str | None = None,
        lora_path: str | None = None,
    ):
        self.fn = fn
        self.name = fn.__name__
        self.inputs = Signature(fn, RESERVED)
        self.model = type_hints(fn).get("return")
        self.fields = questions_of(self.model)
        self.debias, self.calibrate = debias, calibrate
        self.path = path or f"/decisions/{self.name}"
        try:
            self.lora_path = check_lora_path(lora_path)  # its adapter (None: the base model)
        except ValueError as e:
            raise DeclarationError(str(e)) from None
        inspect.signature(fn)  # a clear error for builtins, now rather than at the first call

    def call(self, *args, **kwargs) -> DecisionCall:
        arguments = self.inputs.validate(args, kwargs)
        return self.call_of(self.fn(**arguments))

    def call_of(self, state) -> DecisionCall:
        return DecisionCall(
            messages=messages_of(state),
            questions=tuple(f.question for f in self.fields),
            debias=self.debias,
            calibrate=self.calibrate,
        )

    def decided(self, results: Sequence[QuestionResult], usage: dict | None = None) -> Decided:
        answers, values = {}, {}
        for f, r in zip(self.fields, results, strict=True):
            answer = _field_answer(f, r)
            answers[f.name], values[f.name] = answer, answer.value
        try:
            value = self.model(**values)
        except Exception:  # a refused question leaves its field None
            value = self.model.model_construct(**values)
        return Decided(value=value, answers=answers, usage=usage or {})

    async def adecide(self, *args, engine=None, **kwargs) -> Decided:
        target = decider(engine)
        results, usage = await target.decide(self.call(*args, **kwargs), self.lora_path)
        return self.decided(results, usage)

    def __call__(self, *args, engine=None, **kwargs) -> Decided:
        target = decider(engine)
        call = self.call(*args, **kwargs)
        results, usage = target.run(target.decide(call, self.lora_path))
        return self.decided(results, usage)

    def batch(
        self, inputs: Sequence, engine=None, max_in_flight: int = 8, progress: bool = True
    ) -> list[Decided]:
        """One decision per input (a dict of arguments, or the one argument), in input
        order, up to ``max_in_flight`` at once, with a progress bar."""
        target = decider(engine)
        calls = [self.call(**x) if isinstance(x, dict) else self.call(x) for x in inputs]

        async def all_of():
            from tqdm import tqdm

            bar = tqdm(total=len(calls), desc=self.name, disable=not progress)
            gate = asyncio.Semaphore(max_in_flight)

            async def one(call):
                async with gate:
                    out = await target.decide(call, self.lora_path)
                bar.update(1)
                return out

            try:
                return await asyncio.gather(*(one(c) for c in calls))
            finally:
                bar.close()

        return [self.decided(results, usage) for results, usage in target.run(all_of())]

    def __prefillonly_endpoint__(self):
        from prefillonly_sgl.dsl.decision_endpoint import decision_function_endpoint

        return decision_function_endpoint(self)

    def __repr__(self) -> str:
        return f"<decision {self.name}: {', '.join(f.name for f in self.fields)}>"


def _field_answer(f: FieldQuestion, r: QuestionResult) -> FieldAnswer:
    options = f.question.options
    if f.kind == "scale-label":
        keys = [o.text for o in options]
    else:
        keys = [o.value for o in options]
    probabilities = dict(zip(keys, r.probabilities))
    if r.refusal is not None:
        value = None
    elif f.kind == "bool":
        value = r.probabilities[0] >= 0.5
    else:
        value = keys[r.best]
    return FieldAnswer(value, probabilities, r.confidence, r.label_mass, r.refusal)


def decision(
    fn=None,
    *,
    debias: str = "none",
    calibrate: bool = False,
    path: str | None = None,
    lora_path: str | None = None,
):
    """Declare a decision function (see the module docstring). ``debias``: "none",
    "reverse" or "cyclic" (choice questions asked in other option orders too); ``calibrate``:
    divide out the content-free prior; ``path``: its typed endpoint under serve --app;
    ``lora_path``: the LoRA adapter (a name the engine or server loaded) its questions run
    under, as a classifier's. The call's cache salt is the caller's (``with
    prefillonly.cache_salt(...)``), as for every DSL call."""

    def wrap(f):
        return DecisionFunction(
            f, debias=debias, calibrate=calibrate, path=path, lora_path=lora_path
        )

    return wrap(fn) if fn is not None else wrap


# -- where a call runs ---------------------------------------------------------------------
class _EngineDecider:
    def __init__(self, engine) -> None:
        self.engine = engine

    async def decide(self, call: DecisionCall, lora_path: str | None = None):
        outcome: DecisionOutcome = await self.engine.async_decide_call(call, lora_path=lora_path)
        u = outcome.usage
        usage = {"input_tokens": u.input_tokens, "cached_tokens": u.cached_tokens}
        return list(outcome.results), usage

    def run(self, coroutine):
        return self.engine.run_until_complete(coroutine)


def decider(engine=None):
    """Where a decision runs: an Engine, a server URL or DecisionServer, else the DSL's
    default (``prefillonly.use``)."""
    from prefillonly_sgl.dsl.decision_server import DecisionServer
    from prefillonly_sgl.engine import Engine

    if engine is None:
        from prefillonly_sgl.dsl.backends import default_backend

        default = default_backend()
        engine = getattr(default, "engine", None) or getattr(default, "base_url", None)
        if engine is None:
            raise InvalidRequestError(
                "no engine: pass engine=<Engine | 'http://host:port' | DecisionServer> to the "
                "call, or set a default once with prefillonly_sgl.use(...)"
            )
    if isinstance(engine, Engine):
        return _EngineDecider(engine)
    if isinstance(engine, str):
        return DecisionServer(engine)
    if isinstance(engine, DecisionServer):
        return engine
    raise InvalidRequestError(
        f"engine= must be an Engine, a server URL or a DecisionServer, got {engine!r}"
    )
