"""A moderation call on the scoring front (the SGLang side of prefillonly_sgl/moderation/):
the plan's rounds sent through ScoringFront.score under the call's context (labels of
several tokens by the chain rule, whole-vocabulary probabilities), each round one score
request (the prompts' common prefix once, every prompt's rest packed behind it), their
rows read back into each input's result (moderation/plan.py).

    outcome = await moderate(front, ctx, ModerationCall.of(...))
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillonly_sgl.moderation.flags import Flags, flags_of
from prefillonly_sgl.moderation.guards import recognise, taxonomy_of
from prefillonly_sgl.moderation.moderation_call import (
    ModerationCall,
    check_prompt_lengths,
    plan_call,
)
from prefillonly_sgl.moderation.plan import InputResult
from prefillonly_sgl.scoring.call_context import CallContext


@dataclass(frozen=True)
class ModerationOutcome:
    guard: str  # llama_guard_3, qwen3guard, granite_guardian or policy
    results: list[InputResult]  # per input, the probabilities
    flags: list[Flags]  # per input, what they flag at the call's threshold, OpenAI's keys
    prompt_tokens: int
    cached_tokens: int


async def moderate(front, ctx: CallContext, call: ModerationCall) -> ModerationOutcome:
    """The call's verdicts (module docstring). front: the ScoringFront."""
    tokenizer = front.tokenizer
    guard, plan = plan_call(tokenizer, call, recognise(getattr(tokenizer, "chat_template", None)))
    check_prompt_lengths(plan, front.limits.scoring_prompt_tokens)
    # the rounds' records are children of the call's; every prompt is kept whole in the
    # prefix cache (keep_whole): a second round reads it, and so does a repeat of the
    # conversation (checked again, or its reply checked next)
    ctx = ctx.for_sglang("moderate").replace(keep_whole=True)
    rows, prompt_tokens, cached = [], 0, 0
    for round_ in plan.rounds:
        result = await front.score(
            ctx, round_.query, round_.items, round_.labels, apply_softmax=False
        )
        rows.append(result.scores)
        prompt_tokens += result.prompt_tokens
        cached += result.cached_tokens or 0
    results = plan.read(rows)
    taxonomy = taxonomy_of(guard)
    flags = [flags_of(guard, taxonomy, r, call.threshold) for r in results]
    return ModerationOutcome(guard, results, flags, prompt_tokens, cached)
