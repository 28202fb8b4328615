"""Data labeling on drug reviews: real drugs.com reviews labeled positive / neutral /
negative by ``@classifier`` behind a shared few-shot prefix; accuracy and the confusion
matrix against the dataset's rating-derived labels, with and without contextual
calibration, next to the majority-class baseline.

    python examples/drug_review_labeling.py [--limit 150] [--shots 2] [--model FOLDER]
"""

from __future__ import annotations

import time

from prefillonly_sgl.batch import run_batch
from prefillonly_sgl.data.drug_reviews import load_drug_reviews
from prefillonly_sgl.dsl import Prompt, classifier
from prefillonly_sgl.pipelines.common import engine_for, output_dir, read_results
from prefillonly_sgl.verification.quality_metrics import (
    accuracy,
    balanced_accuracy,
    confusion_matrix,
    format_confusion,
)

LABELS = ["positive", "neutral", "negative"]
INSTRUCTION = "Label the sentiment of each drug review as positive, neutral or negative.\n\n"
MAX_REVIEW_CHARS = 600  # the longest reviews run to ~2k characters: keep items short


def review_item(text: str) -> str:
    return f"Review: {text[:MAX_REVIEW_CHARS]}\nSentiment:"


def review_sentiment_prompt(review: str, examples: str) -> Prompt:
    return Prompt(prefix=examples, item=review_item(review))


review_sentiment = classifier(labels=LABELS)(review_sentiment_prompt)
review_sentiment_calibrated = classifier(labels=LABELS, calibrate="review")(review_sentiment_prompt)


def few_shot_prefix(shots_per_label: int) -> str:
    """The shortest training reviews of each label, interleaved."""
    train = load_drug_reviews("train")
    shots = []
    for label in LABELS:
        pool = sorted((r for r in train if r.sentiment == label), key=lambda r: len(r.text))
        shots += pool[:shots_per_label]
    shots.sort(key=lambda r: r.text)
    return INSTRUCTION + "".join(f"{review_item(r.text)} {r.sentiment}\n\n" for r in shots)


def run(limit=150, shots=2, engine=None, model=None, device=None, out=None, progress=True):
    prefix = few_shot_prefix(shots)
    test = load_drug_reviews("test")[:limit]
    records = [{"review": r.text, "examples": prefix, "truth": r.sentiment} for r in test]
    truth = [r["truth"] for r in records]
    folder = output_dir(out, "drug-reviews")
    report = {
        "reviews": len(records),
        "majority_accuracy": max(truth.count(label) for label in LABELS) / len(truth),
        "truth_counts": {label: truth.count(label) for label in LABELS},
    }
    with engine_for(engine, model, device) as engine:
        for name, function in (
            ("plain", review_sentiment),
            ("calibrated", review_sentiment_calibrated),
        ):
            path = folder / f"labels_{name}.jsonl"
            started = time.perf_counter()
            run_batch(function, records, path, engine=engine, keep=["truth"], overwrite=True,
                      progress=progress)  # fmt: skip
            results = read_results(path)
            predicted = [r["label"] for r in results]
            report[name] = {
                "accuracy": accuracy([r["truth"] for r in results], predicted),
                "balanced_accuracy": balanced_accuracy([r["truth"] for r in results], predicted),
                "confusion": confusion_matrix([r["truth"] for r in results], predicted, LABELS),
                "seconds": time.perf_counter() - started,
            }
    report["output"] = str(folder)
    return report


def print_report(report: dict) -> None:
    counts = ", ".join(f"{n} {label}" for label, n in report["truth_counts"].items())
    print(f"[labeling] {report['reviews']} drug reviews ({counts}); majority-class accuracy "
          f"{report['majority_accuracy']:.3f}")  # fmt: skip
    for name in ("plain", "calibrated"):
        m = report[name]
        print(f"[labeling] {name}: accuracy {m['accuracy']:.3f}, balanced accuracy "
              f"{m['balanced_accuracy']:.3f} ({m['seconds']:.1f} s)")  # fmt: skip
        print(format_confusion(m["confusion"], LABELS))
    print(f"[labeling] results in {report['output']}")
