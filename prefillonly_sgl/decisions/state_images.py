"""A decision state's images, readied for a vision-language model (plain Python).

The wire modules mark where each image of the state goes (call.IMAGE_MARK in a message's
text) and carry the images as given (call.images). The door that reads them puts the
model's image placeholder at each mark and loads each image (scoring/images.py: a URL
or data URL, checked to decode), so the state is text holding one placeholder per image,
in order: the model's processor expands each to the image's tokens, and the state, the
image included, is the reusable prefix every question is scored behind.

    call = with_placeholders(call, placeholder.text)   # InvalidRequestError naming the problem
    images = loaded(call)                              # bytes, each checked
"""

from __future__ import annotations

import dataclasses

from prefillonly_sgl.decisions.call import IMAGE_MARK, DecisionCall, Message
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.images import check_count, load_image


def with_placeholders(call: DecisionCall, placeholder: str) -> DecisionCall:
    """The call with the model's placeholder at each image's mark; refused when the text
    holds the placeholder itself (it would take an image that is not there)."""
    marks = sum(m.content.count(IMAGE_MARK) for m in call.messages)
    if marks != len(call.images):  # the wire modules write one mark per image
        raise InvalidRequestError(f"the state marks {marks} images for {len(call.images)}")
    if any(placeholder in m.content for m in call.messages):
        raise InvalidRequestError(
            f"input: the state's text holds the model's image placeholder ({placeholder!r}) "
            "itself; give images as image parts, not as their placeholder"
        )
    messages = tuple(
        Message(m.role, m.content.replace(IMAGE_MARK, placeholder)) for m in call.messages
    )
    return dataclasses.replace(call, messages=messages)


def loaded(call: DecisionCall) -> list[bytes]:
    """Each image of the call as checked bytes (fetching URLs: call it off the event
    loop), at most MAX_IMAGES."""
    check_count(len(call.images))
    return [load_image(value, where) for where, value in call.images]
