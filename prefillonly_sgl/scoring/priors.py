"""Contextual calibration's arithmetic (plain Python; Zhao et al., "Calibrate Before Use",
2021): the content-free texts a prior is measured with, their average, and the prior
divided out of an answer. Shared by the DSL's calibrated classifiers (dsl/contextual_calibration.py)
and calibrated decisions (decisions/answers.py).
"""

from __future__ import annotations

import math

CONTENT_FREE = ("N/A", "", "[MASK]")


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
