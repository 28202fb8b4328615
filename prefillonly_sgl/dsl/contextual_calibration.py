"""Contextual calibration of a classifier (plain Python; Zhao et al., "Calibrate Before
Use", 2021): small models lean towards some labels whatever the input. The lean is
measured by asking the same prompt with the content replaced by content-free texts
("N/A", "", "[MASK]"), averaging their label probabilities (the prior), and dividing it
out of every answer: p(label) ~ p(label | input) / prior(label), renormalised.

The content is named per classifier (``@classifier(calibrate="review")``): those
parameters get the content-free texts, every other argument (the few-shot examples, the
instruction) is kept, so the prior is measured behind the same prefix. One prior per
distinct set of other arguments, measured once per backend and remembered there
(``Priors``).

Calibration is a transform of the job (``transform``, applied by Backend.run): the
content-free inputs of the contexts the backend has no prior for are appended to the
job's own inputs and sent in the same call, where they share the prefix cache with the
real inputs; ``CalibratedJob.finish`` remembers the new priors and divides them out.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.scoring.priors import CONTENT_FREE, average, divide_prior  # noqa: F401  (the DSL's names)

MAX_PRIORS = 1024  # remembered per backend (one per classifier and context)


def content_params(calibrate, params: list[str], name: str) -> tuple[str, ...]:
    """The parameters that hold the content, from the decorator's ``calibrate``: a name, a
    list of names, or True (the only parameter); () when calibration is off."""
    if calibrate is None or calibrate is False:
        return ()
    if calibrate is True:
        if len(params) != 1:
            raise DeclarationError(
                f"{name}: calibrate=True needs a one-parameter function; name the content "
                f"parameter(s) instead, e.g. calibrate={params[-1]!r} (of {params})"
            )
        return (params[0],)
    names = (calibrate,) if isinstance(calibrate, str) else tuple(calibrate)
    unknown = [n for n in names if n not in params]
    if not names or unknown:
        raise DeclarationError(
            f"{name}: calibrate={calibrate!r} must name parameters of the function {params}"
        )
    return names


def context_key(arguments: dict, content: tuple[str, ...]) -> str:
    """What identifies a prior: every argument but the content."""
    rest = {k: v for k, v in arguments.items() if k not in content}
    return json.dumps(rest, sort_keys=True, default=repr)


def content_free_inputs(arguments: dict, content: tuple[str, ...]) -> list[dict]:
    """The arguments with the content replaced by each content-free text."""
    return [{**arguments, **dict.fromkeys(content, text)} for text in CONTENT_FREE]


class Priors:
    """One backend's measured priors: (classifier, context key) -> label probabilities,
    at most ``limit`` of them (then forgotten, and measured again when next needed)."""

    def __init__(self, limit: int = MAX_PRIORS) -> None:
        self.limit = limit
        self._known: dict[tuple[object, str], list[float]] = {}

    def get(self, function, key: str) -> list[float] | None:
        return self._known.get((function, key))

    def remember(self, function, key: str, prior: list[float]) -> None:
        if len(self._known) >= self.limit:
            self._known.clear()
        self._known[function, key] = prior

    def __len__(self) -> int:
        return len(self._known)


@dataclass(frozen=True)
class CalibratedJob:
    """A classifier job with the content-free inputs of the contexts whose prior is not
    known yet after its own inputs, all sent as one call."""

    job: Any  # the ClassifyJob to send
    inputs: int  # the caller's inputs: the first ``inputs`` of job.inputs
    keys: tuple[str, ...]  # each caller input's context
    measured: tuple[str, ...]  # contexts measured by this job, len(CONTENT_FREE) inputs each

    def finish(self, rows: list[list[float]], priors: Priors) -> list[list[float]]:
        """The caller's rows with their context's prior divided out (the new priors
        remembered first)."""
        function, n = self.job.function, len(CONTENT_FREE)
        known = {key: priors.get(function, key) for key in set(self.keys)}
        for i, key in enumerate(self.measured):
            start = self.inputs + i * n
            known[key] = average(rows[start : start + n])
            priors.remember(function, key, known[key])
        return [divide_prior(row, known[key]) for row, key in zip(rows, self.keys)]


def transform(job, priors: Priors) -> CalibratedJob | None:
    """``job`` as a CalibratedJob when its function calibrates (a classifier declared with
    ``calibrate=``), else None."""
    content = getattr(job.function, "content", ())
    if not content:
        return None
    keys = tuple(context_key(arguments, content) for arguments in job.inputs)
    missing: dict[str, dict] = {}
    for key, arguments in zip(keys, job.inputs):
        if key not in missing and priors.get(job.function, key) is None:
            missing[key] = arguments
    free = [x for arguments in missing.values() for x in content_free_inputs(arguments, content)]
    sent = dataclasses.replace(job, inputs=(*job.inputs, *free))
    return CalibratedJob(sent, len(job.inputs), keys, tuple(missing))
