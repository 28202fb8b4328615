"""Images in the rerank APIs (plain Python): a call's images checked, loaded and placed
for its DSL ranker.

The query's images belong to the reusable prefix: every document's prompt shares them,
so the image is computed once and the documents are packed behind it. A document's own
images belong to its item. Each image goes where its text holds the model's image
placeholder, else before its text, and that text is what the ranker gets as its query
or document: the image sits where the ranker's prompt puts the text (the yes/no judge:
after "<Query>: " / "<Document>: "). The bytes ride on the call's RankJob and reach
/v1/score's image path (scoring/image_prompts.py), which matches them to those
placeholders.

Checked before anything is fetched: the model reads images, the ranker is one of labels
(a likelihood ranker's continuation requests carry no image), at most MAX_IMAGES.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.image_prompts import (
    ImagePlaceholder,
    check_reads_images,
    with_placeholders,
)
from prefillonly_sgl.scoring.images import check_count, load_image

LIKELIHOOD_REFUSAL = (
    "this server's reranker ({name}) is a likelihood ranker, which scores text only (its "
    "continuation's log-probabilities carry no images): serve with --rerank-method judge "
    "(the yes/no judge reads images) or --rerank NAME, a ranker of labels"
)
Refs = list[tuple[str, object]]  # (where in the body, URL or data URL)


@dataclass(frozen=True)
class RerankImages:
    """A call's images as loaded bytes: the query's and, per document, its own."""

    placeholder: ImagePlaceholder
    query: tuple[bytes, ...]
    documents: tuple[tuple[bytes, ...], ...]

    def query_text(self, text: str) -> str:
        return with_placeholders(text, len(self.query), self.placeholder, "query")

    def document_texts(self, documents: list[str], field: str) -> list[str]:
        return [
            with_placeholders(text, len(own), self.placeholder, f"{field}[{i}]")
            for i, (text, own) in enumerate(zip(documents, self.documents, strict=True))
        ]

    @property
    def item_images(self) -> tuple | None:
        return self.documents if any(self.documents) else None


async def load_rerank_images(
    context, reranker, query: Refs, documents: list[Refs]
) -> RerankImages | None:
    """The call's images loaded (None when it has none); InvalidRequestError naming the
    first problem, before any image is fetched where the call cannot take images."""
    given = [*query, *(ref for own in documents for ref in own)]
    if not given:
        return None
    placeholder = context.image_placeholder
    check_reads_images(placeholder, context.image_refusal, given[0][0])
    if reranker.method == "likelihood":
        raise InvalidRequestError(LIKELIHOOD_REFUSAL.format(name=reranker.name))
    check_count(len(given))

    def load(refs: Refs) -> tuple[bytes, ...]:
        return tuple(load_image(value, where) for where, value in refs)

    # Fetching a URL blocks for up to its timeout: off the server's event loop.
    loaded = await asyncio.to_thread(lambda: [load(query), *(load(own) for own in documents)])
    return RerankImages(placeholder, loaded[0], tuple(loaded[1:]))
