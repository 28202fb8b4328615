"""Demo: few-shot sentiment of real drug reviews on the embedded default model, with the
DSL the README teaches first (``@classifier``).

One shared few-shot prefix (the score requests' query, computed once and then served from
SGLang's prefix cache) and one item per review; the labels "positive" / "negative" are
single tokens after the prompt, so each review is one prefill and one read of two logits.

    ./run demo [--limit 60] [--model FOLDER] [--device cpu|cuda]
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from prefillonly_sgl.data.drug_reviews import DrugReview, load_drug_reviews
from prefillonly_sgl.dsl import Prompt, classifier

LABELS = ("positive", "negative")
INSTRUCTION = "Classify the sentiment of each drug review as positive or negative.\n\n"
N_SHOTS_PER_LABEL = 2
BATCH = 8  # reviews per score request: small enough for a smooth progress bar


@dataclass(frozen=True)
class Prediction:
    review: DrugReview
    label: str
    p_positive: float


def item_text(text: str) -> str:
    return f"Review: {text}\nSentiment:"


@classifier(batch_size=BATCH)
def review_sentiment(review: str, examples: str) -> Literal["positive", "negative"]:
    """A drug review's sentiment, after few-shot examples (the shared prefix)."""
    return Prompt(prefix=examples, item=item_text(review))


def few_shot_prefix(train: list[DrugReview]) -> str:
    """The shortest reviews of each label, so the shared prefix stays ~300 tokens."""
    shots = []
    for label in LABELS:
        pool = sorted((r for r in train if r.sentiment == label), key=lambda r: len(r.text))
        shots += pool[:N_SHOTS_PER_LABEL]
    shots.sort(key=lambda r: r.text)  # interleave labels deterministically
    return INSTRUCTION + "".join(f"{item_text(r.text)} {r.sentiment}\n\n" for r in shots)


def classify(engine, reviews: list[DrugReview], prefix: str) -> list[Prediction]:
    results = review_sentiment.batch([(r.text, prefix) for r in reviews], engine=engine)
    return [
        Prediction(review, result.label, result.probs["positive"])
        for review, result in zip(reviews, results)
    ]


def run(limit: int = 60, model: str | None = None, device: str | None = None) -> float:
    """Prints one line per review, then accuracy and throughput; returns the accuracy."""
    from prefillonly_sgl.engine import Engine

    test = [r for r in load_drug_reviews("test") if r.sentiment in LABELS][:limit]
    prefix = few_shot_prefix(load_drug_reviews("train"))
    print(
        f"[demo] drug-review sentiment: {len(test)} real reviews from drugs.com, "
        f"few-shot prefix of {2 * N_SHOTS_PER_LABEL} examples"
    )
    started = time.perf_counter()
    with Engine(model, device=device) as engine:
        print(f"[demo] {engine!r} started in {time.perf_counter() - started:.1f} s")
        t0 = time.perf_counter()
        predictions = classify(engine, test, prefix)
        elapsed = time.perf_counter() - t0
    for i, p in enumerate(predictions):
        mark = "ok " if p.label == p.review.sentiment else "XX "
        snippet = p.review.text[:70].replace("\n", " ")
        print(
            f"{i:3d} {mark} predicted={p.label:<8} truth={p.review.sentiment:<8} "
            f"p(positive)={p.p_positive:.3f}  {snippet}..."
        )
    correct = sum(p.label == p.review.sentiment for p in predictions)
    accuracy = correct / len(predictions)
    majority = max(sum(r.sentiment == lab for r in test) for lab in LABELS) / len(test)
    print(
        f"[demo] accuracy {accuracy:.1%} ({correct}/{len(predictions)}; "
        f"majority-class baseline {majority:.1%})"
    )
    print(
        f"[demo] throughput {len(predictions) / elapsed:.2f} items/s "
        f"({elapsed:.1f} s scoring, engine start excluded)"
    )
    return accuracy
