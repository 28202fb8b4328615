"""Hybrid prefilling's time cost, interleaved: one prompt length, several engines up at once.

    .venv/bin/python benchmarks/hybrid_prefill_ab.py --length 8192 --rounds 3   # ~6 min

A sequential run (`hybrid_prefill.py`) times each configuration minutes apart, and this
machine's speed drifts by ~10% over that; here every round scores one fresh prompt of
--length random tokens on each engine (ours unchunked, mode "layer" at each --chunks size),
in a rotating order, so drift hits all alike. Default model, bfloat16, CPU, the same
allocator setting as hybrid_prefill.py. Prints each time and the median / min / max.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    from prefillonly_sgl import Engine

    common = dict(dtype="bfloat16", context_length=args.length + 256, max_total_tokens=1024)
    configs = {"unchunked": dict(hybrid_prefill=False)}
    for chunk in args.chunks:
        configs[f"layers, chunk {chunk}"] = dict(
            hybrid_prefill_mode="layer", hybrid_prefill_chunk_size=chunk
        )
    engines = {}
    try:
        for name, extra in configs.items():
            engines[name] = Engine(**common, **extra)
        rng = random.Random(0)
        vocab = engines["unchunked"].limits.vocab_size

        def tokens(n: int) -> list[int]:
            return [rng.randrange(200, vocab - 200) for _ in range(n)]

        for engine in engines.values():  # warm-up
            engine.score(tokens(512), [[7]], [5, 6])
        times: dict[str, list[float]] = {name: [] for name in engines}
        names = list(engines)
        for round_ in range(args.rounds):
            k = round_ % len(names)
            for name in names[k:] + names[:k]:
                query, item = tokens(16), tokens(args.length - 16)
                started = time.perf_counter()
                engines[name].score(query, [item], [5, 6])
                times[name].append(time.perf_counter() - started)
                print(f"  round {round_ + 1} {name}: {times[name][-1]:.1f} s", flush=True)
        base = statistics.median(times["unchunked"])
        print(f"\nL={args.length}, {args.rounds} rounds")
        for name, ts in times.items():
            median = statistics.median(ts)
            print(f"  {name:<20} median {median:6.1f} s  (min {min(ts):.1f}, max {max(ts):.1f})"
                  f"  {100 * (median / base - 1):+.1f}%")  # fmt: skip
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
