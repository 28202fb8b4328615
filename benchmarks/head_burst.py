"""A classification head's burst against the label-token model's (issue 76): the paper's
recommendation shape (users behind long profiles, items each), all requests sent at once,
on stock SGLang and on ours, for the default model reading label tokens and for the same
weights under a 3-class head (LlamaForSequenceClassification, a random head: speed only).

    .venv/bin/python benchmarks/head_burst.py          # ~9 min, float32, CPU

Each round draws fresh profiles and items (random token ids), so every profile is cold;
one request per user (its items), all users' requests gathered at once. Systems run one
at a time, each in an engine of its own (stock first, shut down before ours). Prints
medians (min-max) over --rounds after a warm-up round, and each model's stock / ours.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.profile_bursts import LABELS, Bursts, add_shape_arguments  # noqa: E402
from harness.stats import spread  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shape_arguments(parser, requests=4, rounds=2)
    args = parser.parse_args()
    from prefillonly_sgl import STOCK_SGLANG, Engine
    from prefillonly_sgl.models.default_model import default_model_path
    from prefillonly_sgl.models.tiny_heads import HEAD_CLASSES, SENTIMENT, add_head

    bursts = Bursts(args)
    base = str(default_model_path())
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        head_path = add_head(base, Path(tmp) / "head", HEAD_CLASSES["llama"], SENTIMENT)
        for model, path in (("label tokens", base), ("classification head", head_path)):
            labels = LABELS if model == "label tokens" else None
            for system, settings in (("stock", STOCK_SGLANG), ("ours", {})):
                with Engine(path, dtype=args.dtype, **settings) as engine:
                    times = []
                    for round_ in range(args.rounds + 1):
                        seconds = bursts.seconds(engine, label_token_ids=labels)
                        if round_:
                            times.append(seconds)
                        print(f"  {model} / {system} round {round_}: {seconds:.2f} s", flush=True)
                    results[(model, system)] = times
    print(
        f"\n{args.requests} users x {args.items} items ({args.profile_tokens}-token profiles, "
        f"{args.item_tokens}-token items), all at once, {args.dtype}; median (min-max) of "
        f"{args.rounds} rounds:"
    )
    for (model, system), times in results.items():
        print(f"- {model}, {system}: {spread(times)} s")
    for model in ("label tokens", "classification head"):
        stock = statistics.median(results[(model, "stock")])
        ours = statistics.median(results[(model, "ours")])
        print(f"- {model}: stock / ours {stock / ours:.2f}x")


if __name__ == "__main__":
    main()
