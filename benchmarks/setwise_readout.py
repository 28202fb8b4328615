"""The setwise readout (SGLang's score_extraction_token) with the prefix cache on (issue 75):
20 candidates in one prompt behind a cached 1k-token profile, against a pointwise request
of the same tokens (the 20 candidates as 20 items behind the same profile) on ours, and
the same setwise requests sent twice to stock SGLang, which serves the readout only with
its radix cache and chunked prefill off, and to ours.

    .venv/bin/python benchmarks/setwise_readout.py            # ~3 min, float32, CPU

Each round draws a fresh profile and fresh candidates (random token ids of the default
model; each candidate --candidate-tokens tokens, the anchor after it). Ours: a warm-up
call caches the profile, then the setwise call and the pointwise call in alternating
order (each with its own fresh candidates). Setwise twice: a fresh profile and
candidates, the same request sent twice, on stock (cache off) and on ours. Prints medians
(min-max) over --rounds; round 0 warms up and is not counted. Stock runs first, in an
engine of its own, shut down before ours starts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

LABELS = [11, 12]


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def _timed(call, *args, **kwargs) -> float:
    started = time.perf_counter()
    call(*args, **kwargs)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--candidate-tokens", type=int, default=20)
    parser.add_argument("--profile-tokens", type=int, default=1024)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from prefillonly_sgl import STOCK_SGLANG, Engine

    rng = random.Random(75)
    anchor = 0  # replaced by the tokenizer's end-of-text id below

    def tokens(n: int, vocab: int) -> list[int]:
        return [t for t in (rng.randrange(200, vocab - 200) for _ in range(n)) if t != anchor]

    def request(vocab: int) -> tuple[list[int], list[list[int]], list[int]]:
        """(profile, the candidates, the setwise item: each candidate then the anchor)."""
        profile = tokens(args.profile_tokens, vocab)
        candidates = [tokens(args.candidate_tokens, vocab) for _ in range(args.candidates)]
        return profile, candidates, [t for c in candidates for t in (*c, anchor)]

    twice: dict[str, list[tuple[float, float]]] = {"stock": [], "ours": []}
    # (SGLang sizes its CPU memory fraction from a chunk it no longer has: given here)
    stock = dict(
        STOCK_SGLANG, disable_radix_cache=True, chunked_prefill_size=-1, mem_fraction_static=0.8
    )
    for system, settings in (("stock", stock), ("ours", {})):
        with Engine(dtype=args.dtype, **settings) as engine:
            vocab = engine.limits.vocab_size
            anchor = engine.tokenizer.eos_token_id
            setwise = {"score_extraction_token": anchor}
            if system == "ours":
                alone = {"setwise": [], "pointwise": []}
                for round_ in range(args.rounds + 1):
                    profile = tokens(args.profile_tokens, vocab)
                    engine.score(profile, [tokens(8, vocab)], LABELS)  # the profile cached
                    order = ["setwise", "pointwise"][:: 1 if round_ % 2 else -1]
                    for kind in order:
                        _, candidates, item = request(vocab)
                        if kind == "setwise":
                            seconds = _timed(engine.score, profile, [item], LABELS, **setwise)
                        else:
                            with_anchor = [[*c, anchor] for c in candidates]
                            seconds = _timed(engine.score, profile, with_anchor, LABELS)
                        if round_:
                            alone[kind].append(seconds)
                            print(f"  ours round {round_} {kind}: {seconds:.3f} s", flush=True)
            for round_ in range(args.rounds + 1):
                profile, _, item = request(vocab)
                first = _timed(engine.score, profile, [item], LABELS, **setwise)
                again = _timed(engine.score, profile, [item], LABELS, **setwise)
                if round_:
                    twice[system].append((first, again))
                    print(f"  {system} round {round_} twice: {first:.3f} + {again:.3f} s")
    tokens_each = args.profile_tokens + args.candidates * (args.candidate_tokens + 1)
    print(
        f"\n{args.candidates} candidates of {args.candidate_tokens} tokens behind a "
        f"{args.profile_tokens}-token profile ({tokens_each} tokens a request), {args.dtype}, "
        f"median (min-max) of {args.rounds} rounds:"
    )
    ratio = [s / p for s, p in zip(alone["setwise"], alone["pointwise"], strict=True)]
    print(f"- ours, profile cached: setwise {_summary(alone['setwise'])}")
    print(f"- ours, profile cached: pointwise, the same tokens {_summary(alone['pointwise'])}")
    print(
        f"- setwise / pointwise: {statistics.median(ratio):.2f}x "
        f"({min(ratio):.2f}-{max(ratio):.2f})"
    )
    for system, pairs in twice.items():
        total = [a + b for a, b in pairs]
        print(
            f"- {system}, the same setwise request twice: first {_summary([a for a, _ in pairs])}, "
            f"again {_summary([b for _, b in pairs])}, both {_summary(total)}"
        )
    stock_total = [a + b for a, b in twice["stock"]]
    ours_total = [a + b for a, b in twice["ours"]]
    print(
        "- stock / ours (both sends): "
        f"{statistics.median(stock_total) / statistics.median(ours_total):.2f}x"
    )


if __name__ == "__main__":
    main()
