"""/v1/score with images (a documented extension: SGLang's ScoringRequest has no image
field and its handler would drop one): a body carrying `image_data` (the query's images,
shared by every item: one image or a list) or `item_image_data` (per item, a list of its
own images) is answered here, in SGLang's answer shape, through the ScoringFront's image
path (Engine.score's: scoring/image_prompts.py places the images, scoring/images.py loads
them; a URL or a data URL each, never a path of the server's). The rest of the body is
SGLang's ScoringRequest, validated as SGLang validates it.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.call_context import CallContext
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.image_prompts import with_images_off_the_loop
from prefillonly_sgl.scoring.score_options import ScoreOptions

IMAGE_FIELDS = ("image_data", "item_image_data")


def carries_images(body: object) -> bool:
    return isinstance(body, dict) and any(body.get(f) is not None for f in IMAGE_FIELDS)


async def score_with_images(front, ctx: CallContext, body: dict, served_model: str) -> dict:
    """SGLang's /v1/score answer (ScoringResponse's fields) to a body with images."""
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ScoringRequest

    from prefillonly_sgl.decisions.bodies import validation_message

    rest = {k: v for k, v in body.items() if k not in IMAGE_FIELDS}
    try:
        request = ScoringRequest.model_validate(rest)
    except ValidationError as e:
        raise InvalidRequestError(f"invalid request: {validation_message(e, rest)}") from None
    unsupported = [
        name
        for name in ("score_extraction_token", "embed_override_token_id", "item_first")
        if getattr(request, name, None)
    ]
    if unsupported:
        raise InvalidRequestError(f"image_data cannot be combined with {', '.join(unsupported)}")
    query, items, image_data = await with_images_off_the_loop(
        request.query,
        request.items,
        body.get("image_data"),
        body.get("item_image_data"),
        front.facts.image_placeholder,
        allow_paths=False,
    )
    result = await front.score(
        ctx,
        query,
        items,
        request.label_token_ids,
        request.apply_softmax,
        options=ScoreOptions(temperature=request.temperature, image_data=image_data),
    )
    return {
        "scores": result.scores,
        "model": request.model or served_model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        "object": "scoring",
    }
