"""Run a compiled decision on a scoring function and read its answers (plain Python: the
score function is the Engine's or the server's ScoringFront.score, passed in).

    plan = plan_decision(call, tokenizer, limit)        # plan.py
    outcome = await decide(plan, score, usage)          # this module
    outcome.results                                     # answers.py, per question

The plan's score requests go out at once: they share the state's tokens as their query,
so the scheduler sees one prefix group and computes the state once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prefillonly_sgl.decisions.answers import results
from prefillonly_sgl.decisions.call import DecisionOutcome, DecisionUsage
from prefillonly_sgl.decisions.plan import DecisionPlan
from prefillonly_sgl.scoring.usage import RequestUsage

# score(query ids, items' ids, labels' ids) -> per item the labels' whole-vocabulary
# probabilities (Engine.score with apply_softmax=False); a group with images is text, and
# its images come as the keyword image_data (per item, the state's images)
ScoreFn = Callable[..., Awaitable[list[list[float]]]]


async def raw_probabilities(plan: DecisionPlan, score: ScoreFn) -> dict[int, list[float]]:
    """Each planned prompt's option probabilities, keyed by its index in plan.prompts."""
    rows = await asyncio.gather(
        *(score(g.query, g.items, g.labels, **_images(g)) for g in plan.groups)
    )
    raw: dict[int, list[float]] = {}
    for group, group_rows in zip(plan.groups, rows, strict=True):
        for index, row in zip(group.prompts, group_rows, strict=True):
            raw[index] = list(row)
    return raw


def _images(group) -> dict:
    return {} if group.image_data is None else {"image_data": group.image_data}


def usage_of(plan: DecisionPlan, usage: RequestUsage) -> DecisionUsage:
    """The call's usage (the record SGLang's per-prompt meta_info filled meanwhile);
    cache_write_tokens: the state tokens this call computed."""
    return DecisionUsage(
        input_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        cache_write_tokens=usage.write_tokens(plan.state_tokens),
        prompts=usage.prompts,
    )


async def decide(plan: DecisionPlan, score: ScoreFn, usage: RequestUsage) -> DecisionOutcome:
    """Answers and usage; ``usage`` is the call's record, filled while it runs."""
    raw = await raw_probabilities(plan, score)
    return DecisionOutcome(results=tuple(results(plan, raw)), usage=usage_of(plan, usage))
