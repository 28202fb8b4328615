"""Which checks a work request's body gets, by path: one table (plain Python).

The guard (guard.py) reads a body, looks its path up here and runs the check, which
raises InvalidRequestError / RequestTooLargeError naming the problem and returns the
number of prompts the request costs for admission control. SGLang's own routes are
listed by path; the typed endpoints (EndpointSpecs) count their prompts themselves and
validate with their request models; any other guarded path gets a JSON object check. A
spec that claims some bodies of an SGLang path (EndpointSpec.claims: vLLM's /v1/score
shapes) has its check for those, SGLang's for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.server.request_checks import (
    check_chat_body,
    check_completions_body,
    check_generate_body,
    check_object_body,
    check_prompt_count,
    check_score_body,
)


@dataclass(frozen=True)
class CheckContext:
    """What the checks need of the running server."""

    limits: ModelLimits
    count_prompt_tokens: Callable[[Any, Any], int]
    max_prompts: int
    labels_required: bool  # /v1/score on a generation model names its labels


RouteCheck = Callable[[object, CheckContext], int]

SGLANG_ROUTES: dict[str, RouteCheck] = {
    "/v1/score": lambda body, c: check_score_body(
        body, c.limits, c.count_prompt_tokens, c.max_prompts, labels_required=c.labels_required
    ),
    "/generate": lambda body, c: check_generate_body(body, c.limits, c.max_prompts),
    "/v1/completions": lambda body, c: check_completions_body(body, c.limits, c.max_prompts),
    "/v1/chat/completions": lambda body, c: check_chat_body(body, c.limits, c.max_prompts),
}


def _counted(count_prompts: Callable[[dict], int]) -> RouteCheck:
    """A typed endpoint's check: a JSON object, its prompts counted by the endpoint (its
    request model validates the rest, with a 400 naming the field)."""

    def check(body: object, c: CheckContext) -> int:
        check_object_body(body)
        try:
            n = max(1, int(count_prompts(body)))
        except Exception:  # a malformed body: the request model's validation says why
            return 1
        check_prompt_count(n, "request", c.max_prompts)
        return n

    return check


def _any_object(body: object, c: CheckContext) -> int:
    return check_object_body(body, c.max_prompts)


def _claimed(claims: Callable[[object], bool], check: RouteCheck, others: RouteCheck):
    """A path served by two shapes: ``check`` for the bodies ``claims`` takes, ``others``
    for the rest."""
    return lambda body, c: check(body, c) if claims(body) else others(body, c)


def route_checks(endpoints: Iterable) -> dict[str, RouteCheck]:
    """The table: SGLang's routes, then each typed endpoint (EndpointSpec) that counts its
    prompts."""
    table = dict(SGLANG_ROUTES)
    for spec in endpoints:
        if spec.claims is not None:
            own = _counted(spec.count_prompts or (lambda body: 1))
            table[spec.path] = _claimed(spec.claims, own, table.get(spec.path, _any_object))
        elif spec.count_prompts is not None:
            table[spec.path] = _counted(spec.count_prompts)
    return table


def check_request(table: dict[str, RouteCheck], path: str, body: object, c: CheckContext) -> int:
    """The prompts the request costs, after its path's check (any other path: a JSON
    object, times OpenAI's `n`)."""
    return table.get(path, _any_object)(body, c)
