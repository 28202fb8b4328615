"""A decision call whose state holds images, on the scoring front (the SGLang side of
decisions/state_images.py): the model checked to read images before any is fetched, the
model's placeholder put at each image's place, the images loaded off the event loop,
then the plan sent as ScoringFront.decide sends it, but as text with the images beside
every question (decisions/plan.py: the processor expands the placeholders, so the state,
its images included, is the reusable prefix, computed once, each question behind it).

    outcome = await decide_with_images(front, ctx, call)
"""

from __future__ import annotations

import asyncio

from prefillonly_sgl.decisions.call import DecisionCall, DecisionOutcome
from prefillonly_sgl.decisions.checkpoints import CHECKPOINT_REFUSAL
from prefillonly_sgl.decisions.execution import decide
from prefillonly_sgl.decisions.plan import plan_decision
from prefillonly_sgl.decisions.state_images import loaded, with_placeholders
from prefillonly_sgl.scoring.call_context import CallContext
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.score_options import ScoreOptions


async def decide_with_images(front, ctx: CallContext, call: DecisionCall) -> DecisionOutcome:
    """The call's answers (module docstring). front: the ScoringFront."""
    if front.readout.is_checkpoint:  # SGLang's own handler reads a checkpoint's images
        raise InvalidRequestError(CHECKPOINT_REFUSAL)
    placeholder = front.facts.image_placeholder
    if placeholder is None:
        raise InvalidRequestError(
            f"{call.images[0][0]}: an image needs a vision-language model; this server's "
            "model reads text only (docs/images.md lists the families that read images)"
        )
    if front.facts.image_refusal is not None:
        raise InvalidRequestError(front.facts.image_refusal)
    call = with_placeholders(call, placeholder.text)
    images = await asyncio.to_thread(loaded, call)  # a URL's fetch blocks up to its timeout
    plan = plan_decision(call, front.tokenizer, front.limits.scoring_prompt_tokens, images)
    decision = ctx.for_sglang("decide")  # the score calls' records are its children

    async def score(query, items, labels, image_data=None):
        options = ScoreOptions(image_data=image_data)
        result = await front.score(decision, query, items, labels, False, options=options)
        return result.scores

    return await decide(plan, score, decision.record.usage)
