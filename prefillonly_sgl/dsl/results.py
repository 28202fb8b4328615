"""Result models: pydantic classes built per declared function, typed by its label type
(the ``Literal[...]`` or ``Enum`` of its labels) and, for rankers, by its item type."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from prefillonly_sgl.scoring.labels import LabelSet


class Classification(BaseModel):
    """``label``: the most probable label (the first one on a tie); ``probs`` and
    ``logprobs``: per label text, normalised over the labels unless the function was
    declared with ``normalize=False`` (then shares of the whole vocabulary)."""

    model_config = ConfigDict(frozen=True)

    label: Any
    probs: dict[str, float]
    logprobs: dict[str, float]

    @property
    def prob(self) -> float:
        """The probability of the chosen label."""
        return max(self.probs.values())

    @property
    def label_text(self) -> str:
        """The chosen label as its text (``label`` may be an Enum member or an int)."""
        return max(self.probs, key=self.probs.get)  # the first on a tie, as ``label``


class RankedItem(BaseModel):
    """One candidate: ``index`` is its position in the call's ``items``; ``probs`` and
    ``logprobs`` per label (empty for a likelihood ranker); ``token_logprobs``: a
    likelihood ranker's continuation, per token (None for labels)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    item: Any
    index: int
    score: float
    probs: dict[str, float]
    logprobs: dict[str, float]
    token_logprobs: list[float] | None = None


class Ranking(BaseModel):
    """``items``: the top_k candidates, best first (ties keep input order);
    ``by_input``: every candidate in input order."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    items: list[RankedItem]
    by_input: list[RankedItem]


def classification_model(name: str, labels: LabelSet) -> type[Classification]:
    return create_model(f"{name}Result", __base__=Classification, label=(labels.label_type, ...))


def ranking_model(name: str, item_type: Any) -> type[Ranking]:
    item_model = create_model(f"{name}Item", __base__=RankedItem, item=(item_type, ...))
    return create_model(
        f"{name}Ranking",
        __base__=Ranking,
        items=(list[item_model], ...),
        by_input=(list[item_model], ...),
    )


def label_probs(labels: LabelSet, row: list[float]) -> tuple[dict, dict]:
    """(probs, logprobs) dicts keyed by label text from one score row."""
    probs = dict(zip(labels.texts, row, strict=True))
    logprobs = {t: math.log(p) if p > 0 else -math.inf for t, p in probs.items()}
    return probs, logprobs


def classify_row(model: type[Classification], labels: LabelSet, row: list[float]):
    probs, logprobs = label_probs(labels, row)
    best = max(range(len(row)), key=lambda j: (row[j], -j))
    return model(label=labels.values[best], probs=probs, logprobs=logprobs)


def classifications(function, rows: list[list[float]]) -> list[Classification]:
    """A classifier's typed results from probability rows (label order), one per row."""
    return [classify_row(function.result_model, function.labels, row) for row in rows]
