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
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

LABELS = [11, 12]


def build_head(out: Path, base: str) -> Path:
    """The default model's weights under a 3-class head (random: the head's cost only)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    labels = ("negative", "neutral", "positive")
    model = AutoModelForSequenceClassification.from_pretrained(
        base,
        num_labels=3,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        dtype=torch.float32,
    )
    model.config.pad_token_id = None
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def burst(engine, requests, head: bool) -> float:
    """Seconds until every request of the burst is answered."""

    async def all_at_once():
        calls = [
            engine.async_score(profile, items, None if head else LABELS)
            for profile, items in requests
        ]
        return await asyncio.gather(*calls)

    started = time.perf_counter()
    engine.run_until_complete(all_at_once())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--profile-tokens", type=int, default=1000)
    parser.add_argument("--item-tokens", type=int, default=100)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from prefillonly_sgl import STOCK_SGLANG, Engine
    from prefillonly_sgl.models.default_model import default_model_path

    rng = random.Random(76)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(200, 40000) for _ in range(n)]

    def requests():
        return [
            (tokens(args.profile_tokens), [tokens(args.item_tokens) for _ in range(args.items)])
            for _ in range(args.users)
        ]

    base = str(default_model_path())
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        head_path = build_head(Path(tmp) / "head", base)
        for model, path in (("label tokens", base), ("classification head", head_path)):
            for system, settings in (("stock", STOCK_SGLANG), ("ours", {})):
                with Engine(path, dtype=args.dtype, **settings) as engine:
                    times = []
                    for round_ in range(args.rounds + 1):
                        seconds = burst(engine, requests(), model != "label tokens")
                        if round_:
                            times.append(seconds)
                        print(f"  {model} / {system} round {round_}: {seconds:.2f} s", flush=True)
                    results[(model, system)] = times
    print(
        f"\n{args.users} users x {args.items} items ({args.profile_tokens}-token profiles, "
        f"{args.item_tokens}-token items), all at once, {args.dtype}; median (min-max) of "
        f"{args.rounds} rounds:"
    )
    for (model, system), times in results.items():
        print(
            f"- {model}, {system}: {statistics.median(times):.2f} s "
            f"({min(times):.2f}-{max(times):.2f})"
        )
    for model in ("label tokens", "classification head"):
        stock = statistics.median(results[(model, "stock")])
        ours = statistics.median(results[(model, "ours")])
        print(f"- {model}: stock / ours {stock / ours:.2f}x")


if __name__ == "__main__":
    main()
