"""OpenAI's /v1/moderations (openai-python `client.moderations.create`): the request, the
answer, and the answer built from a moderation outcome (plain Python, pydantic).

    {input: "text" | ["text", ...] | [{type: "text", text}, ...], model?}
 -> {id: "modr-...", model, results: [one per input: {flagged, categories,
     category_scores, category_applied_input_types}]}

OpenAI's 13 keys are always present; a key no category of the guard answers (the mapping
table of docs/moderation.md, moderation/taxonomies.py) is null in `categories` and
`category_scores` and has no input types, never an invented score.

Extensions (extra_body for the openai client; none is sent by OpenAI's client):
- request: `policies` (a policy classifier's texts, or Granite Guardian's risks),
  `categories` (the guard's categories to check), `guard` (the family, when the chat
  template does not say), `threshold` (the probability that flags, default 0.5),
  `cache_salt`; `input` may also be one conversation (a list of {role, content}) or a list
  of them (a reply checked in its conversation);
- answer: per result `flagged_probability`, `guard_categories` / `guard_category_scores`
  (the guard's own codes, or the policies), `verdicts` (each verdict's probability),
  `label_mass`; top level `guard` (the family read) and `usage` with cached tokens.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefillonly_sgl.moderation.flags import DEFAULT_THRESHOLD, Flags
from prefillonly_sgl.moderation.moderation_call import MAX_INPUTS, MAX_POLICIES
from prefillonly_sgl.moderation.plan import InputResult
from prefillonly_sgl.moderation.taxonomies import OPENAI_CATEGORIES
from prefillonly_sgl.wire.fields import cache_salt_field

INPUT_DESCRIPTION = (
    "A text, a list of texts, or a list of {type: 'text', text} parts (one input); "
    "extension: a conversation (a list of {role, content}) or a list of conversations."
)


class ModerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Any = Field(description=INPUT_DESCRIPTION)
    model: str | None = None
    # prefillonly extensions
    policies: list[str] | None = Field(None, max_length=MAX_POLICIES)
    categories: list[str] | None = Field(None, max_length=64)
    guard: str | None = None
    threshold: float = Field(DEFAULT_THRESHOLD, gt=0.0, le=1.0)
    cache_salt: str | None = cache_salt_field()

    @field_validator("input", mode="after")
    @classmethod
    def _inputs(cls, value):
        return conversations_of(value)


def conversations_of(value) -> list:
    """OpenAI's `input` as the inputs of a ModerationCall (moderation/moderation_call.py): a text, a
    list of texts, a list of typed parts (one input, as OpenAI reads it: its texts joined),
    a conversation, or a list of conversations. ValueError naming what is wrong (an image
    part: this server's models read text only)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ValueError("must be a non-empty text or list")
    if len(value) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} inputs per request, got {len(value)}")
    if all(isinstance(x, str) for x in value):
        return value
    if all(isinstance(x, dict) and "type" in x for x in value):
        texts = []
        for n, part in enumerate(value):
            if part["type"] == "image_url":
                raise ValueError(f"[{n}] is an image_url part: the served model reads text only")
            if part["type"] != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"[{n}] must be {{'type': 'text', 'text': ...}}")
            texts.append(part["text"])
        return ["\n".join(texts)]
    if all(isinstance(x, dict) and "role" in x for x in value):
        return [value]
    if all(isinstance(x, list) for x in value):
        return value
    raise ValueError(
        "must be a text, a list of texts, a list of {type: 'text'} parts, a conversation "
        "(a list of {role, content}) or a list of conversations"
    )


class ModerationResult(BaseModel):
    flagged: bool
    categories: dict[str, bool | None]
    category_scores: dict[str, float | None]
    category_applied_input_types: dict[str, list[Literal["text", "image"]]]
    # prefillonly extensions
    flagged_probability: float
    guard_categories: dict[str, bool]
    guard_category_scores: dict[str, float]
    verdicts: dict[str, float]
    label_mass: float


class ModerationUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]


class ModerationResponse(BaseModel):
    id: str
    model: str
    results: list[ModerationResult]
    guard: str  # extension: the guard family read (or "policy")
    usage: ModerationUsage  # extension


def to_result(result: InputResult, flags: Flags) -> ModerationResult:
    return ModerationResult(
        flagged=flags.flagged,
        categories=dict(flags.openai_flags),
        category_scores=dict(flags.openai_scores),
        category_applied_input_types={
            key: [] if flags.openai_scores[key] is None else ["text"] for key in OPENAI_CATEGORIES
        },
        flagged_probability=result.flagged_probability,
        guard_categories=dict(flags.guard_flags),
        guard_category_scores=dict(result.categories),
        verdicts=dict(result.verdicts),
        label_mass=result.label_mass,
    )


def to_response(model: str, outcome) -> ModerationResponse:
    """The answer to a moderation call. outcome: a ModerationOutcome
    (sglang_runtime/moderation_calls.py)."""
    return ModerationResponse(
        id=f"modr-{secrets.token_hex(12)}",
        model=model,
        results=[to_result(r, f) for r, f in zip(outcome.results, outcome.flags, strict=True)],
        guard=outcome.guard,
        usage=ModerationUsage(
            prompt_tokens=outcome.prompt_tokens,
            total_tokens=outcome.prompt_tokens,
            prompt_tokens_details={"cached_tokens": outcome.cached_tokens},
        ),
    )
