"""A rerank query or document with images, in the shapes the multimodal rerank APIs
publish (plain Python, pydantic). Cohere's and TEI's own rerank APIs take text only; on
a vision-language model the rerank routes also read:

- SGLang's /v1/rerank (its Qwen3-VL-Reranker path): the query or a document as a list of
  OpenAI content parts, ``[{"type": "text", "text": ...}, {"type": "image_url",
  "image_url": {"url": ...}}]``;
- vLLM's: the same parts wrapped, ``{"content": [...]}``;
- Jina's (jina-reranker-m0) and OpenRouter's: a document object ``{"text": ..., "image":
  URL}`` (which is also a Cohere v1 document object: the real cohere client sends it);
- ours, for clients whose query is a string (Cohere's SDKs, TEI's): ``image_data``, the
  query's images, beside it (apis/rerank.py).

Each image is a URL or a data URL (scoring/images.py loads it). ``split_content`` turns
any of them into the text and its images, each image named by where it was in the body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    url: str
    detail: str | None = None  # OpenAI's; images are read at the processor's own size


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class DocumentObject(BaseModel):
    """A document (or query) as an object: Cohere's / Jina's ``text`` with Jina's
    ``image`` (a URL or a list of them), or vLLM's ``content`` parts."""

    # A Cohere v1 document object may carry other fields (its rank_fields): ignored.
    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    image: str | list[str] | None = None
    content: list[ContentPart] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _something(self):
        if self.content is not None and (self.text is not None or self.image is not None):
            raise ValueError("give content (vLLM's parts) or text and image, not both")
        if self.content is None and self.text is None and not self.image:
            raise ValueError("a document object needs text, image or content")
        return self


# What a query or a document may be on the rerank routes.
RerankContent = str | list[ContentPart] | DocumentObject


def split_content(value: Any, where: str) -> tuple[str, list[tuple[str, Any]]]:
    """(its text, its images as (where, URL) pairs). Text parts join with newlines; the
    images are placed before the text (at its image placeholders where it holds them:
    scoring/image_prompts.py)."""
    if isinstance(value, str):
        return value, []
    if isinstance(value, DocumentObject):
        if value.content is None:
            images = [value.image] if isinstance(value.image, str) else list(value.image or [])
            name = f"{where}.image"
            refs = [(name if len(images) == 1 else f"{name}[{k}]", v) for k, v in enumerate(images)]
            return value.text or "", refs
        value, where = value.content, f"{where}.content"
    texts, refs = [], []
    for k, part in enumerate(value):
        if isinstance(part, TextPart):
            texts.append(part.text)
        else:
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            refs.append((f"{where}[{k}]", url))
    return "\n".join(texts), refs


def content_text(value: Any) -> str:
    """The text of a query or document (what an answer echoes: never its images)."""
    return split_content(value, "")[0]


def image_list(value: Any, where: str) -> list[tuple[str, Any]]:
    """An ``image_data`` field (one image or a list) as (where, URL) pairs."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [(f"{where}[{k}]", v) for k, v in enumerate(values)]
