"""What a fixed KV pool buys as prefix cache: stock SGLang vs prefill-only KV (issue 4).

    PYTHONPATH=. .venv/bin/python benchmarks/prefix_cache_capacity.py
    PYTHONPATH=. .venv/bin/python benchmarks/prefix_cache_capacity.py --users 4 8 16

Recommendation-style traffic: U users, each with a profile (the query, the reusable
prefix, --query tokens); in every round each user in turn scores one new item (--item
tokens). Both configurations get the same KV pool (--pool tokens). Stock SGLang caches
every finished prompt whole (profile + item), so the pool holds about pool / (query +
item) users' profiles and a round-robin over more users evicts each profile before its
next turn (LRU); prefill-only KV caches only the profile: about pool / query users.
Reported per U: the share of the reusable prefix served from the cache in rounds 2+
(SGLang's cached_tokens over the query tokens) and the mean seconds per request there.
Random token ids, the default model, one engine at a time, on CPU unless --device cuda.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path


def run_config(model, name, ours, args, labels_text=(" Yes", " No")) -> list[dict]:
    from prefillonly_sgl import STOCK_SGLANG, Engine

    print(f"{name}: starting (pool {args.pool} tokens)", flush=True)
    engine = Engine(
        model,
        device=args.device,
        dtype="bfloat16" if args.device == "cuda" else "auto",
        max_total_tokens=args.pool,
        **({} if ours else STOCK_SGLANG),
    )
    rows = []
    try:
        tok = engine.tokenizer
        labels = [tok.encode(w, add_special_tokens=False)[0] for w in labels_text]
        vocab = engine.limits.vocab_size
        for users in args.users:
            rng = random.Random(users)  # the same prompts for both configurations

            def tokens(n, rng=rng):
                return [rng.randrange(200, vocab - 200) for _ in range(n)]

            profiles = [tokens(args.query) for _ in range(users)]
            cached, seconds = [], []
            for round_ in range(args.rounds):
                for profile in profiles:
                    item = tokens(args.item)
                    t0 = time.perf_counter()
                    result = engine.score(profile, [item], labels)
                    if round_ > 0:  # round 1 is cold for everybody
                        seconds.append(time.perf_counter() - t0)
                        cached.append(min(result.cached_tokens, args.query))
            row = dict(
                config=name,
                users=users,
                prefix_hit=sum(cached) / (len(cached) * args.query),
                seconds=statistics.mean(seconds),
            )
            rows.append(row)
            print(
                f"  {name} users={users}: {row['prefix_hit']:.0%} of profile tokens cached, "
                f"{row['seconds']:.2f} s per request",
                flush=True,
            )
    finally:
        engine.shutdown()
    return rows


def render(rows, args) -> str:
    import torch

    by = {(r["config"], r["users"]): r for r in rows}
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), device {args.device}. "
        f"Default model. KV pool {args.pool} tokens for both; profile (query) {args.query} "
        f"tokens, item {args.item} tokens, {args.rounds} rounds round-robin over the users; "
        f"rounds 2+ measured. Load average (1 min) now: {os.getloadavg()[0]:.1f}.",
        "",
        "| users | stock: profile tokens cached | ours: profile tokens cached "
        "| stock s/request | ours s/request |",
        "|---|---|---|---|---|",
    ]
    for users in args.users:
        s, o = by.get(("stock", users)), by.get(("prefill-only KV", users))
        if s and o:
            lines.append(
                f"| {users} | {s['prefix_hit']:.0%} | {o['prefix_hit']:.0%} "
                f"| {s['seconds']:.2f} | {o['seconds']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=2048)
    parser.add_argument("--query", type=int, default=256)
    parser.add_argument("--item", type=int, default=256)
    parser.add_argument("--users", type=int, nargs="+", default=[3, 6, 12])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "prefix_cache.md"
    )
    args = parser.parse_args()
    from prefillonly_sgl.models.default_model import default_model_path

    model = default_model_path()
    rows = run_config(model, "stock", False, args)
    rows += run_config(model, "prefill-only KV", True, args)
    text = render(rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
