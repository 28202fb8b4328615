"""``@moderator``: a Python function that renders what to check (a text, or a
conversation) and returns a typed moderation answer (plain Python; where it runs is
passed in).

    import prefillonly_sgl as prefillonly

    @prefillonly.moderator  # the served guard's own categories (Llama Guard 3, ...)
    def reply_check(question: str, reply: str):
        return [{"role": "user", "content": question},
                {"role": "assistant", "content": reply}]

    m = reply_check("How do I...", "You can...", engine=engine)
    m.flagged, m.guard_category_scores["S1"], m.category_scores["violence"]
    reply_check.many([("q1", "r1"), ("q2", "r2")], engine=engine)   # one call

    @prefillonly.moderator(policies=["No medical advice.", "No insults."])
    def ticket_policies(ticket: str) -> str:   # any model: the caller's policies
        return ticket

    prefillonly.moderate("some text", engine=engine)   # without declaring a function

The answer is the server's (wire/openai_moderation.ModerationResult: OpenAI's fields,
the guard's own categories, verdicts and label mass) plus ``guard``, the same from an
Engine in this process (Engine.moderate) as from a server's /v1/moderations (a URL, or a
RemoteBackend with its key: ``engine="http://host:30000"``). ``many`` sends its inputs as
one call: the guard's shared prompt (Llama Guard's category list) computed once.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from prefillonly_sgl.dsl.signature import Signature
from prefillonly_sgl.moderation.flags import DEFAULT_THRESHOLD
from prefillonly_sgl.moderation.moderation_call import ModerationCall
from prefillonly_sgl.scoring.adapters import check_lora_path
from prefillonly_sgl.scoring.call_context import salt_fields
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.wire import openai_moderation as wire

RESERVED = ("engine",)


class Moderation(wire.ModerationResult):
    """One input's answer: OpenAI's fields, the guard's own, and the guard family read."""

    guard: str


class ModerationFunction:
    kind = "moderation"

    def __init__(self, fn, policies, categories, guard, threshold, lora_path) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.inputs = Signature(fn, RESERVED)  # its arguments validated as every DSL call's
        self.options = {
            "policies": list(policies) if policies else None,
            "categories": list(categories) if categories is not None else None,
            "guard": guard,
            "threshold": threshold,
        }
        self.lora_path = check_lora_path(lora_path)
        # checked at declaration, as every DSL function's options are
        ModerationCall.of("declaration check", **self.options)
        functools.update_wrapper(self, fn)

    def render(self, *args, **kwargs):
        """The function's text or conversation for these arguments (validated)."""
        value = self.fn(**self.inputs.validate(args, kwargs))
        if isinstance(value, str) or (isinstance(value, list) and value):
            return value
        raise InvalidRequestError(
            f"{self.name} must return a text or a conversation (a list of {{role, content}}), "
            f"got {value!r}"
        )

    def __call__(self, *args, engine=None, **kwargs) -> Moderation:
        (answer,) = _run(engine, [self.render(*args, **kwargs)], self.options, self.lora_path)
        return answer

    def many(self, arguments, engine=None) -> list[Moderation]:
        """Each element of ``arguments`` (a tuple of positional arguments, a dict of
        keyword arguments, or one value) checked, all in one call."""
        inputs = [self.render(*_as_args(a)[0], **_as_args(a)[1]) for a in arguments]
        return self.run_on(engine, inputs)

    def run_on(self, engine, inputs: list) -> list[Moderation]:
        """Rendered inputs checked in one call (the batch runner's chunks)."""
        return _run(engine, inputs, self.options, self.lora_path)

    def __repr__(self) -> str:
        return f"<moderation {self.name} {self.options}>"


def _as_args(value) -> tuple[tuple, dict]:
    if isinstance(value, dict):
        return (), value
    if isinstance(value, tuple):
        return value, {}
    return (value,), {}


def moderator(
    fn=None,
    *,
    policies=None,
    categories=None,
    guard: str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    lora_path: str | None = None,
):
    """Declare a moderation function (module docstring). (Not ``@moderation``:
    ``prefillonly_sgl.moderation`` is the package that plans the calls.)"""

    def wrap(f):
        if not callable(f) or inspect.isclass(f):
            raise InvalidRequestError("@moderator decorates a function")
        return ModerationFunction(f, policies, categories, guard, threshold, lora_path)

    return wrap(fn) if fn is not None else wrap


def text_moderation(policies=None, categories=None, guard=None) -> ModerationFunction:
    """The moderation of one text (`prefillonly batch moderate`: each record's `text`)."""

    def moderate_text(text: str) -> str:
        return text

    return ModerationFunction(moderate_text, policies, categories, guard, DEFAULT_THRESHOLD, None)


def moderate(
    input,
    *,
    engine=None,
    policies=None,
    categories=None,
    guard: str | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    lora_path: str | None = None,
) -> list[Moderation]:
    """Check ``input`` (a text, a list of texts, a conversation or a list of them): one
    answer per input, in order."""
    options = {"policies": policies, "categories": categories, "guard": guard}
    try:
        inputs = wire.conversations_of(input)
    except ValueError as e:
        raise InvalidRequestError(f"input: {e}") from None
    return _run(engine, inputs, {**options, "threshold": threshold}, check_lora_path(lora_path))


# -- where a call runs ---------------------------------------------------------------------
def _run(target, inputs: list, options: dict, lora_path: str | None) -> list[Moderation]:
    from prefillonly_sgl.dsl.backends import LocalEngineBackend, RemoteBackend, resolve_backend

    backend = resolve_backend(target)
    if isinstance(backend, LocalEngineBackend):
        engine = backend.engine
        outcome = engine.moderate(inputs, lora_path=lora_path, **options)
        backend.count_usage(outcome.prompt_tokens, outcome.cached_tokens)
        name = Path(str(engine.model_path)).name
        return _typed(wire.to_response(name, outcome), len(inputs), repr(engine))
    if isinstance(backend, RemoteBackend):
        body = {"input": inputs, **{k: v for k, v in options.items() if v is not None}}
        body.update(salt_fields())
        if lora_path is not None:
            body["lora_path"] = lora_path
        answer = wire.ModerationResponse.model_validate(backend.post("/v1/moderations", body))
        details = answer.usage.prompt_tokens_details
        backend.count_usage(answer.usage.prompt_tokens, details.get("cached_tokens", 0))
        return _typed(answer, len(inputs), backend.base_url)
    raise InvalidRequestError(
        f"moderation runs on an Engine or a server (a URL or RemoteBackend), not {backend!r}"
    )


def _typed(answer: wire.ModerationResponse, n: int, where: str) -> list[Moderation]:
    if len(answer.results) != n:
        raise InvalidRequestError(f"{where}: {len(answer.results)} answers to {n} inputs")
    return [Moderation(**r.model_dump(), guard=answer.guard) for r in answer.results]
