"""Which way a chat or completions request with an output constraint goes (plain Python,
on the request's fields as a dict): answered by scoring, run on SGLang's grammar path
under the constraint in SGLang's fields, or refused naming the problem.

    no constraint                          -> SGLang's handler, the request as it is
    a malformed constraint, or two         -> refused (InvalidRequestError's message)
    outside the choice shape, or asking    -> SGLang's path, vLLM's fields translated
      what scoring cannot honour             (constraints.FALL_THROUGH_FIELDS), or a
      (or a classification head's model)     model with a classification head
    a choice request                       -> scored; after SGLang's own checks and
                                              conversion it still falls through when its
                                              prompt carries video or audio, images the
                                              model's image path cannot score, or its
                                              token limit cannot hold the longest answer
                                              (SGLang truncates)

The SGLang side (its request objects, checks and conversion) is
sglang_runtime/choice_requests.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import BaseModel

from prefillonly_sgl.choices.answering import longest_answer_tokens
from prefillonly_sgl.choices.constraints import Constraint, find_constraint, scorable
from prefillonly_sgl.choices.shapes import ChoiceShape
from prefillonly_sgl.scoring.errors import InvalidRequestError


class VLLMConstraints(BaseModel):
    """vLLM's output constraints, which our chat and completions request models take
    (sglang_runtime/single_token.py; SGLang's would drop them and the request would run
    unconstrained)."""

    structured_outputs: dict | None = None
    guided_choice: list | None = None
    guided_regex: str | None = None
    guided_json: dict | str | None = None
    guided_grammar: str | None = None


VLLM_FIELDS = tuple(VLLMConstraints.model_fields)

# What a route decides (Route.way)
UNCONSTRAINED = "unconstrained"  # SGLang's handler, the request unchanged
REFUSED = "refused"  # an error naming the problem (Route.error)
SGLANG_PATH = "sglang_path"  # SGLang's grammar path under sglang_path_update's fields
SCORED = "scored"  # answered by scoring (after SGLang's checks and conversion)


@dataclass(frozen=True)
class Route:
    way: str
    constraint: Constraint | None = None
    error: str | None = None


def route(fields: dict, chat: bool, head: bool) -> Route:
    """The way a request goes, from its fields (`response_format` as a dict). head: the
    model has a classification head (it has no vocabulary to score choices over)."""
    try:
        constraint = find_constraint(fields, chat)
    except InvalidRequestError as e:
        return Route(REFUSED, error=str(e))
    if constraint is None:
        return Route(UNCONSTRAINED)
    if not scorable(constraint, fields) or head:
        return Route(SGLANG_PATH, constraint)
    return Route(SCORED, constraint)


def sglang_path_update(fields: dict, constraint: Constraint) -> dict:
    """The fields to change for SGLang's path: vLLM's constraint fields cleared, SGLang's
    carrying the constraint (none where the request's own are SGLang's)."""
    update: dict = {name: None for name in VLLM_FIELDS if fields.get(name) is not None}
    update.update(constraint.sglang_fields)
    return update


def answer_token_limit(fields: dict, chat: bool, max_tokens_given: bool) -> int | None:
    """The answer's token limit the client gave (None: none given). chat:
    `max_completion_tokens`, else `max_tokens`; completions: `max_tokens` when the client
    sent it (`max_tokens_given`): its default of 16 is not a limit the client asked for."""
    if chat:
        value = fields.get("max_completion_tokens")
        return fields.get("max_tokens") if value is None else value
    return fields.get("max_tokens") if max_tokens_given else None


def falls_through_after_conversion(
    media: Collection[str],
    scores_images: bool,
    prompts: int,
    limit: int | None,
    shape: ChoiceShape,
    encode: Callable[[str], list[int]],
) -> bool:
    """A choice request that runs on SGLang's path after all, once SGLang converted it.
    media: the kinds its prompts carry ("image", "video", "audio"); scores_images: the
    model's images are scored (a vision-language model whose image path is not refused,
    docs/images.md); prompts: how many. It falls through when it carries video or audio
    (they go with SGLang's own request only), images on a model that cannot score them or
    across several prompts (a chat has one), or its token limit is below the longest
    answer's tokens (SGLang truncates)."""
    if set(media) - {"image"}:
        return True
    if "image" in media and (not scores_images or prompts != 1):
        return True
    return limit is not None and limit < longest_answer_tokens(shape, encode)
