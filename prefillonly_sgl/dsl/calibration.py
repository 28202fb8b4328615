"""Contextual calibration of a classifier (plain Python; Zhao et al., "Calibrate Before
Use", 2021): small models lean towards some labels whatever the input. The lean is
measured by asking the same prompt with the content replaced by content-free texts
("N/A", "", "[MASK]"), averaging their label probabilities (the prior), and dividing it
out of every answer: p(label) ~ p(label | input) / prior(label), renormalised.

The content is named per classifier (``@classifier(calibrate="review")``): those
parameters get the content-free texts, every other argument (the few-shot examples, the
instruction) is kept, so the prior is measured behind the same prefix. One prior per
distinct set of other arguments, computed once per backend and remembered.
"""

from __future__ import annotations

import json
import math

from prefillonly_sgl.dsl.signature import DeclarationError

CONTENT_FREE = ("N/A", "", "[MASK]")
MAX_PRIORS = 256  # remembered per classifier (one per backend and context)


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


def average(rows: list[list[float]]) -> list[float]:
    return [sum(column) / len(rows) for column in zip(*rows)]


def divide_prior(row: list[float], prior: list[float]) -> list[float]:
    """``row`` with the prior divided out, renormalised to sum 1 (a label the prior puts
    at 0 keeps 0 weight rather than dividing by it)."""
    scaled = [p / q if q > 0 else 0.0 for p, q in zip(row, prior)]
    total = sum(scaled)
    if total <= 0 or not math.isfinite(total):
        return list(row)
    return [s / total for s in scaled]
