"""/v1/classify's chat with images (plain Python): `messages` with `image_url` parts on a
vision-language model. The chat is rendered with each image part as the template's image
placeholder (wire/chat_images.py), that text is the classifier's input as ever, and the
images go to the classifier's prompt where their placeholders landed: those in its
prefix as the prefix's images, those in its item as the item's (docs/images.md), loaded
and checked before anything is scored (a bad one is a 400 naming its message part).

    messages, images = chat_with_images(request.messages, placeholder, refusal)
    ...render messages, check_placeholders(text, len(images), placeholder)...
    job = ChatImagesJob(function, inputs, *split_images(prompt, loaded, placeholder))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefillonly_sgl.dsl.job import ClassifyJob
from prefillonly_sgl.dsl.request import CompiledCall
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.image_prompts import check_reads_images
from prefillonly_sgl.scoring.images import check_count
from prefillonly_sgl.wire.chat_images import ChatImage, chat_images


def chat_with_images(messages, placeholder, refusal: str | None) -> tuple[list, list[ChatImage]]:
    """(the messages as the template reads them, their images); a model that reads text
    only, or whose images this engine refuses, is refused before any image is fetched."""
    rendered, images = chat_images(messages or [])
    if images:
        check_reads_images(placeholder, refusal, images[0].where)
    check_count(len(images))
    return rendered, images


def check_placeholders(text: str, n: int, placeholder) -> None:
    """The rendered (and perhaps cut) chat holds one placeholder per image."""
    found = text.count(placeholder.text)
    if found != n:
        raise InvalidRequestError(
            f"messages: the rendered chat holds {found} image placeholder(s) for {n} "
            "image(s) (a chat template that drops image parts, or truncate_prompt_tokens "
            "cutting one)"
        )


def split_images(prompt, images: Sequence[bytes], placeholder) -> tuple[tuple, tuple]:
    """(the prefix's images, the item's) of the classifier's prompt for the chat's text:
    in order, as many as each part holds placeholders."""
    if prompt.images or prompt.item_images:
        raise InvalidRequestError(
            "the classifier's prompt has images of its own: a chat's images cannot be "
            "placed beside them"
        )
    in_prefix = prompt.prefix.count(placeholder.text)
    if in_prefix + prompt.item.count(placeholder.text) != len(images):
        raise InvalidRequestError(
            "messages: the classifier's prompt does not hold the chat's image placeholders "
            f"once each ({len(images)} image(s)): it must take the rendered chat as it is"
        )
    return tuple(images[:in_prefix]), tuple(images[in_prefix:])


@dataclass(frozen=True, eq=False)
class ChatImagesJob(ClassifyJob):
    """A classify job whose one input is a chat with images: ``prefix_images`` go to its
    prompt's prefix, ``item_images`` to its item (inputs after it, a calibration's
    content-free ones, get none of the item's)."""

    prefix_images: tuple = ()
    item_images: tuple = ()

    def compile(self, tokenizer) -> CompiledCall:
        return self.function.compile_arguments(
            tokenizer, list(self.inputs), self.batch_size, images=self._images()
        )

    def compile_for_head(self, tokenizer) -> CompiledCall:
        return self.function.compile_arguments(
            tokenizer, list(self.inputs), self.batch_size, head=True, images=self._images()
        )

    def _images(self) -> tuple:
        own = (self.item_images,) + ((),) * (len(self.inputs) - 1)
        return self.prefix_images, own
