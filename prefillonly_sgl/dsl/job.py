"""What one DSL call asks of a backend (plain Python): a probability row per input, in
input order, label order within a row.

A backend either compiles the job to score requests with its tokenizer (``compile``,
Backend.run) or, when its server has the function's typed endpoint, posts the job's
arguments there (RemoteBackend). Classifiers and rankers build jobs and turn the rows into
results; where a job runs is the backend's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefillonly_sgl.dsl.request import CompiledCall


@dataclass(frozen=True, eq=False)
class ClassifyJob:
    """Classify each of ``inputs`` (validated arguments of a classifier)."""

    function: Any  # a Classifier
    inputs: tuple[dict, ...]
    batch_size: int | None = None  # inputs per score request (None: one per shared prefix)

    def __len__(self) -> int:
        return len(self.inputs)

    def compile(self, tokenizer) -> CompiledCall:
        return self.function.compile_arguments(tokenizer, list(self.inputs), self.batch_size)

    def compile_for_head(self, tokenizer) -> CompiledCall:
        """The requests for a model with a classification head (no labels)."""
        return self.function.compile_arguments(
            tokenizer, list(self.inputs), self.batch_size, head=True
        )


@dataclass(frozen=True, eq=False)
class RankJob:
    """Score each of ``items`` against the ``shared`` arguments of a ranker."""

    function: Any  # a Ranker
    shared: dict
    items: tuple
    # Images the call adds to every prompt's own (the rerank APIs': a query's or a
    # document's images come beside the text, not from the ranker's arguments): the
    # query's, shared by every item, and per item its own (None: none).
    images: tuple = ()
    item_images: tuple | None = None

    def __len__(self) -> int:
        return len(self.items)

    def compile(self, tokenizer) -> CompiledCall:
        return self.function.compile_arguments(
            tokenizer, self._arguments(), None, images=self._images()
        )

    def compile_for_head(self, tokenizer) -> CompiledCall:
        """The requests for a model with a classification head (no labels)."""
        return self.function.compile_arguments(
            tokenizer, self._arguments(), None, head=True, images=self._images()
        )

    def _arguments(self) -> list[dict]:
        return [{**self.shared, self.function.item_param: x} for x in self.items]

    def _images(self) -> tuple | None:
        if not self.images and not any(self.item_images or ()):
            return None
        return self.images, self.item_images


Job = ClassifyJob | RankJob
