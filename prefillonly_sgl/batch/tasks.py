"""What a batch job asks of each record (plain Python): the DSL function's arguments from
the record's fields, the prefix the record's prompt shares with others, and its result row.

classifier   each record holds the function's arguments; result: label and probs
ranker       each record holds the shared arguments and one item; records with equal
             shared arguments are scored as one ranking call; result: score and probs
moderation   each record holds the function's arguments (a text); a chunk is one
             moderation call; result: flagged, its probability and each category's
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

from prefillonly_sgl.dsl.job import ClassifyJob, RankJob
from prefillonly_sgl.dsl.prompt import Prompt
from prefillonly_sgl.dsl.signature import validate_list
from prefillonly_sgl.scoring.errors import InvalidRequestError


@dataclass(frozen=True)
class Prepared:
    row: int
    arguments: dict  # validated arguments (a ranker's: the shared ones)
    item: Any  # a ranker's item; None for a classifier
    prefix: str  # the prompt's shared prefix: records with equal prefixes go together
    kept: dict  # record fields copied to the result


class Task:
    """A DSL function applied to records. ``columns`` maps a parameter to the record field
    holding it when the names differ; ``keep`` names fields copied into each result."""

    def __init__(self, function, columns: dict | None = None, keep=()) -> None:
        self.function = function
        self.columns = dict(columns or {})
        self.keep = tuple(keep)
        params = list(function.inputs.signature.parameters)
        unknown = sorted(set(self.columns) - set(params))
        if unknown:
            raise InvalidRequestError(
                f"columns: {unknown} are not parameters of {function.fn.__qualname__} {params}"
            )
        self.params = params

    def field_of(self, param: str) -> str:
        return self.columns.get(param, param)

    def _fields(self, record: dict, params) -> dict:
        """The record's values for ``params``; a parameter with a default may be absent."""
        values = {}
        for param in params:
            field = self.field_of(param)
            if field in record and record[field] is not None:
                values[param] = record[field]
            elif (
                self.function.inputs.signature.parameters[param].default is inspect.Parameter.empty
            ):
                raise InvalidRequestError(
                    f"missing field {field!r} (for the parameter {param!r})"
                    + ("" if field in record else f"; the record has {sorted(record)[:12]}")
                )
        return values

    def _kept(self, record: dict) -> dict:
        missing = [k for k in self.keep if k not in record]
        if missing:
            raise InvalidRequestError(f"missing field(s) {missing} asked to be kept")
        return {k: record[k] for k in self.keep}

    def _prefix(self, arguments: dict) -> str:
        value = self.function.fn(**arguments)
        return value.prefix if isinstance(value, Prompt) else ""

    def check_same_job(self, done: dict[int, dict], where) -> None:
        """Earlier results being resumed (``done``, by row, from ``where``) must be of this
        function's kind and labels (a result or a flat row with ``prob_<label>`` fields)."""
        if not done:
            return
        sample = next(iter(done.values()))
        if self.kind == "moderation":
            if "flagged" not in sample:
                raise InvalidRequestError(
                    f"{where} holds results of another job (fields {sorted(sample)[:8]}), not "
                    f"of the moderation {self.function.fn.__qualname__}: pass overwrite=True "
                    "(--overwrite) or another output"
                )
            return
        expected = "label" if self.kind == "classifier" else "score"
        labels = set(self.function.labels.texts)
        found = set(sample.get("probs") or {}) or {k[5:] for k in sample if k.startswith("prob_")}
        if expected not in sample or found != labels:
            raise InvalidRequestError(
                f"{where} holds results of another job (fields {sorted(sample)[:8]}), not of "
                f"{self.function.fn.__qualname__} (labels {sorted(labels)}): pass "
                "overwrite=True (--overwrite) or another output"
            )

    def prepare(self, row: int, record: dict) -> Prepared:
        raise NotImplementedError

    def score(self, backend, batch: list[Prepared]) -> list[dict]:
        raise NotImplementedError


class ClassifierTask(Task):
    kind = "classifier"

    def prepare(self, row: int, record: dict) -> Prepared:
        arguments = self.function.inputs.validate((), self._fields(record, self.params))
        return Prepared(row, arguments, None, self._prefix(arguments), self._kept(record))

    def score(self, backend, batch: list[Prepared]) -> list[dict]:
        job = ClassifyJob(self.function, tuple(p.arguments for p in batch))
        results = self.function.results(backend.wait(backend.run(job)))
        return [
            {"row": p.row, **p.kept, "label": r.label_text, "probs": r.probs}
            for p, r in zip(batch, results)
        ]


class RankerTask(Task):
    kind = "ranker"

    def prepare(self, row: int, record: dict) -> Prepared:
        item_param = self.function.item_param
        shared = [p for p in self.params if p != item_param]
        values = self._fields(record, shared + [item_param])
        item = validate_list(item_param, self.function.item_type, [values.pop(item_param)])[0]
        arguments = self.function.inputs.validate((), values)
        prefix = self._prefix({**arguments, item_param: item})
        return Prepared(row, arguments, item, prefix, self._kept(record))

    def score(self, backend, batch: list[Prepared]) -> list[dict]:
        groups: dict[str, list[Prepared]] = {}
        for p in batch:  # one ranking call per distinct set of shared arguments
            groups.setdefault(json.dumps(p.arguments, sort_keys=True, default=repr), []).append(p)
        out = {}
        for members in groups.values():
            job = RankJob(self.function, members[0].arguments, tuple(p.item for p in members))
            ranking = self.function.ranking(list(job.items), backend.wait(backend.run(job)))
            for p, ranked in zip(members, ranking.by_input):
                out[p.row] = {"row": p.row, **p.kept, "score": ranked.score, "probs": ranked.probs}
        return [out[p.row] for p in batch]


class ModerationTask(Task):
    kind = "moderation"

    def prepare(self, row: int, record: dict) -> Prepared:
        arguments = self.function.inputs.validate((), self._fields(record, self.params))
        return Prepared(row, arguments, None, "", self._kept(record))

    def score(self, backend, batch: list[Prepared]) -> list[dict]:
        inputs = [self.function.render(**p.arguments) for p in batch]
        answers = self.function.run_on(backend, inputs)
        return [
            {
                "row": p.row,
                **p.kept,
                "flagged": m.flagged,
                "flagged_probability": m.flagged_probability,
                "probs": m.guard_category_scores,  # CSV: a prob_<category> column each
            }
            for p, m in zip(batch, answers, strict=True)
        ]


def task_for(function, columns=None, keep=()) -> Task:
    kind = getattr(function, "kind", None)
    if kind == "classifier":
        return ClassifierTask(function, columns, keep)
    if kind == "ranker":
        return RankerTask(function, columns, keep)
    if kind == "moderation":
        return ModerationTask(function, columns, keep)
    raise InvalidRequestError(
        "a batch job runs a @prefillonly.classifier, @prefillonly.ranker or "
        f"@prefillonly.moderator, got {function!r}"
    )
