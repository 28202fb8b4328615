"""Where a score call's images go in its prompts (plain Python).

A vision-language model reads an image where its prompt holds the model's image
placeholder (Qwen2.5-VL: "<|vision_start|><|image_pad|><|vision_end|>"); SGLang's
processor gives each placeholder, in order, the next image of the prompt and expands it to
the image's tokens. An image with no placeholder would be dropped silently by SGLang
(and a placeholder with no image scored as text), so every call is checked here:

- the query's images (shared by every item) go where the query's placeholders are, or,
  when it has none, at the query's start, one after another;
- an item's own images likewise in the item;
- each prompt's images are the query's then the item's (SGLang's image_data per item);
  the query's image is the same bytes in every prompt, so SGLang keys it the same in the
  prefix cache and the prompts after the first read it from there.

    query, items, image_data = place_images(query, items, images, item_images, placeholder)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.images import check_count, load_image

# Vision-language models whose image path SGLang 0.5.23 runs wrong on some attention
# backends: (the backends that run it right, why). Images are refused elsewhere rather
# than scored wrong; text is served as ever.
WRONG_IMAGE_PATHS = {
    "Gemma3ForConditionalGeneration": (
        ("triton",),
        "Gemma 3 attends bidirectionally within an image, which SGLang implements only on "
        "its Triton attention backend (elsewhere causally, unlike the model)",
    ),
}


def image_refusal(architectures, attention_backend: str | None) -> str | None:
    """Why this model's images must be refused on this attention backend, or None."""
    for arch in architectures or ():
        if arch in WRONG_IMAGE_PATHS:
            right, why = WRONG_IMAGE_PATHS[arch]
            if attention_backend not in right:
                return (
                    f"images are refused on this engine: {why}; this engine runs "
                    f"{attention_backend or 'the default'} attention (start it with "
                    f"attention_backend={right[0]!r} on a device that has it)"
                )
    return None


@dataclass(frozen=True)
class ImagePlaceholder:
    """How the served model marks an image in text, and the token its processor expands
    (one per image token in the prompt's ids)."""

    text: str
    pad_token_id: int


def place_images(
    query,
    items: Sequence,
    images: Sequence[bytes] = (),
    item_images: Sequence[Sequence[bytes]] | None = None,
    placeholder: ImagePlaceholder | None = None,
) -> tuple[str, list[str], list[list[bytes]]]:
    """(the query, the items, each prompt's images) with a placeholder for every image;
    InvalidRequestError naming the problem."""
    check_reads_images(placeholder)
    if item_images is not None and len(item_images) != len(items):
        raise InvalidRequestError(
            f"item_images has {len(item_images)} entries for {len(items)} items: give one "
            "list per item ([] for an item without images)"
        )
    per_item = [list(x) for x in item_images] if item_images is not None else [[]] * len(items)
    check_count(len(images) + sum(len(x) for x in per_item))
    if not isinstance(query, str) or not all(isinstance(item, str) for item in items):
        raise InvalidRequestError(
            "a call with images takes its query and items as text (the model's processor "
            "expands each image's placeholder in it)"
        )
    query = with_placeholders(query, len(images), placeholder, "the query")
    items = [
        with_placeholders(item, len(own), placeholder, f"items[{i}]")
        for i, (item, own) in enumerate(zip(items, per_item, strict=True))
    ]
    return query, items, [list(images) + own for own in per_item]


def check_reads_images(
    placeholder: ImagePlaceholder | None, refusal: str | None = None, where: str = ""
) -> None:
    """InvalidRequestError where a call's images cannot be read: the model reads text only
    (no placeholder), or this engine refuses its images (``refusal``: image_refusal's
    reason); ``where`` names the call's first image. Every door asks it before fetching."""
    named = f"{where}: " if where else ""
    if placeholder is None:
        raise InvalidRequestError(
            f"{named}images need a vision-language model: this model reads text only "
            "(docs/images.md lists the families that read images)"
        )
    if refusal is not None:
        raise InvalidRequestError(f"{named}{refusal}")


def with_images(query, items, images, item_images, placeholder, allow_paths: bool):
    """(query, items, each prompt's image bytes) of a call given images in any form: the
    model checked to read images (before anything is fetched), every image loaded
    (scoring/images.py; paths only with ``allow_paths``), then placed (place_images)."""
    check_reads_images(placeholder)
    items = [items] if isinstance(items, str) else list(items or [])
    shared, own = loaded_images(images, item_images, allow_paths)
    return place_images(query, items, shared, own, placeholder)


async def with_images_off_the_loop(query, items, images, item_images, placeholder, allow_paths):
    """with_images in a worker thread: fetching a URL (up to 10 s each) or decoding a large
    image must not stall the event loop every other request of the server waits on."""
    return await asyncio.to_thread(
        with_images, query, items, images, item_images, placeholder, allow_paths
    )


def loaded_images(images, item_images, allow_paths: bool):
    """The call's images (an image or a list for the query; per item a list) as checked
    bytes (scoring/images.py), each error naming its image."""
    if images is None:
        images = []
    elif not isinstance(images, list | tuple):
        images = [images]  # one image
    query = [load_image(v, f"images[{k}]", allow_paths) for k, v in enumerate(images)]
    if item_images is None:
        return query, None
    if not isinstance(item_images, list | tuple):
        raise InvalidRequestError("item_images must be a list: per item, a list of images")
    per_item = []
    for i, own in enumerate(item_images):
        own = [] if own is None else own if isinstance(own, list | tuple) else [own]
        per_item.append(
            [load_image(v, f"item_images[{i}][{k}]", allow_paths) for k, v in enumerate(own)]
        )
    return query, per_item


def with_placeholders(text: str, n: int, placeholder: ImagePlaceholder, where: str) -> str:
    """``text`` holding one placeholder per image: as it is when it holds ``n``, with
    ``n`` put first when it holds none; InvalidRequestError naming ``where`` otherwise."""
    found = text.count(placeholder.text)
    if found == n:
        return text
    if found == 0:
        return placeholder.text * n + text
    raise InvalidRequestError(
        f"{where} holds {found} image placeholder(s) ({placeholder.text!r}) for {n} "
        "image(s): write one per image, or none (the images then go first)"
    )
