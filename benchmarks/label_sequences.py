"""Labels of several tokens: what a score call costs with 2- and 3-token labels against
1-token labels, on one engine, rounds interleaved (issue 24).

    .venv/bin/python benchmarks/label_sequences.py                 # ~4 min, bf16, CPU
    .venv/bin/python benchmarks/label_sequences.py --items 1 --item-tokens 512

Each round: a fresh profile (--profile-tokens random tokens) is cached by one warm-up
call, then the same --items fresh items (--item-tokens each) are scored behind it with
each label set in a rotating order (a fresh item set per label set, so none of them is a
cache hit of another's): label sets of two labels of 1, 2 and 3 tokens (the 2- and
3-token labels share no first token: 2 and 4 continuation requests per item). Prints
per label set the median seconds and the ratio to 1-token labels, with min / max.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--item-tokens", type=int, default=128)
    parser.add_argument("--profile-tokens", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    from prefillonly_sgl import Engine

    with Engine(dtype=args.dtype) as engine:
        rng = random.Random(0)
        vocab = engine.limits.vocab_size

        def tokens(n: int) -> list[int]:
            return [rng.randrange(200, vocab - 200) for _ in range(n)]

        label_sets = {
            "1 token": [[11], [12]],
            "2 tokens": [[11, 21], [12, 22]],
            "3 tokens": [[11, 21, 31], [12, 22, 32]],
        }
        times: dict[str, list[float]] = {name: [] for name in label_sets}
        names = list(label_sets)
        for round_ in range(args.rounds + 1):  # round 0 warms up, not counted
            profile = tokens(args.profile_tokens)
            engine.score(profile, [tokens(8)], [5, 6])  # the profile is cached from here
            k = round_ % len(names)
            for name in names[k:] + names[:k]:
                items = [tokens(args.item_tokens) for _ in range(args.items)]
                started = time.perf_counter()
                result = engine.score(profile, items, label_sets[name])
                elapsed = time.perf_counter() - started
                assert len(result.scores) == args.items
                if round_:
                    times[name].append(elapsed)
                    print(f"  round {round_} {name}: {elapsed:.3f} s", flush=True)
        base = statistics.median(times["1 token"])
        shape = f"{args.items} items x {args.item_tokens} tokens"
        print(f"\n{shape} behind a cached {args.profile_tokens}-token profile, {args.dtype}, "
              f"{args.rounds} rounds")  # fmt: skip
        for name, ts in times.items():
            median = statistics.median(ts)
            print(f"  {name:<9} median {median:.3f} s (min {min(ts):.3f}, max {max(ts):.3f})"
                  f"  {median / base:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
