"""Example: few-shot sentiment of real drug reviews (drugs.com) with @prefillonly.classifier,
on the embedded default model (SmolLM2-135M-Instruct).

The few-shot examples are the prompt's shared prefix, so a batch of reviews compiles to a
few score requests whose query is that prefix (SGLang's prefix cache computes it once)
and whose items are the reviews. Labels come from the return annotation.

    python examples/classify_sentiment.py [--per-label 12] [--model FOLDER] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import time
from typing import Literal

import prefillonly_sgl as prefillonly
from prefillonly_sgl.data.drug_reviews import load_drug_reviews

Sentiment = Literal["positive", "negative"]


@prefillonly.classifier
def sentiment(review: str, examples: str) -> Sentiment:
    return prefillonly.Prompt(prefix=examples, item=f"Review: {review}\nSentiment:")


def few_shot_examples(shots_per_label: int = 2) -> str:
    """The shortest training reviews of each label (keeps the shared prefix short)."""
    train = load_drug_reviews("train")
    shots = []
    for label in ("positive", "negative"):
        pool = sorted((r for r in train if r.sentiment == label), key=lambda r: len(r.text))
        shots += pool[:shots_per_label]
    shots.sort(key=lambda r: r.text)  # interleave the labels deterministically
    intro = "Classify the sentiment of each drug review as positive or negative.\n\n"
    return intro + "".join(f"Review: {r.text}\nSentiment: {r.sentiment}\n\n" for r in shots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-label", type=int, default=12, help="test reviews per label")
    parser.add_argument("--model", default=None, help="model folder (default: embedded)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16: ~2x faster on CPU")
    args = parser.parse_args()

    reviews = load_drug_reviews("test")  # balanced: the first N of each label, in file order
    test = [r for r in reviews if r.sentiment == "positive"][: args.per_label]
    test += [r for r in reviews if r.sentiment == "negative"][: args.per_label]
    examples = few_shot_examples()
    with prefillonly.Engine(args.model, device=args.device, dtype=args.dtype) as engine:
        started = time.perf_counter()
        results = sentiment.batch([(r.text, examples) for r in test], engine=engine)
        elapsed = time.perf_counter() - started

    for review, result in list(zip(test, results))[:: max(1, len(test) // 6)]:
        print(f"{result.label:<8} p={result.prob:.2f} truth={review.sentiment:<8} "
              f"{review.text[:60]!r}...")  # fmt: skip
    correct = sum(res.label == r.sentiment for r, res in zip(test, results))
    print(
        f"accuracy {correct / len(test):.1%} ({correct}/{len(test)} real reviews, half of "
        f"each label: chance is 50%); {len(test) / elapsed:.2f} reviews/s"
    )


if __name__ == "__main__":
    main()
