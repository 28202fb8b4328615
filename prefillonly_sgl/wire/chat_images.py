"""The images of an OpenAI chat (plain Python): its `image_url` parts (and the Responses
API's `input_image`), each named by where it is, and the messages as a chat template
reads them, each image part as `{"type": "image"}` (what SGLang hands the template: a
vision-language model's template writes its image placeholder there).

    messages, images = chat_images(body["messages"])   # images: [ChatImage(where, url)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

IMAGE_PARTS = ("image_url", "input_image")


@dataclass(frozen=True)
class ChatImage:
    where: str  # "messages[0].content[1]": what an error about it names
    url: object  # as the client sent it: an http(s) URL or a data URL (checked on loading)


def chat_images(messages: Sequence) -> tuple[list, list[ChatImage]]:
    """(the messages with each image part as {"type": "image"}, the images in order)."""
    rendered, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            rendered.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in IMAGE_PARTS:
                parts.append(part)
                continue
            url = part.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            images.append(ChatImage(f"messages[{i}].content[{j}]", url))
            parts.append({"type": "image"})
        rendered.append({**message, "content": parts})
    return rendered, images
