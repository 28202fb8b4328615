"""LoRA adapters per request (issue 76): a burst of 4 adapters x 8 items behind one profile
per adapter, against the same burst under one adapter (and under none), on ours.

    .venv/bin/python benchmarks/lora_burst.py          # ~4 min, float32, CPU

Four r=8 adapters of every projection of the default model, made with peft (random
weights: speed only; models/tiny_adapters.py). A burst: 4 requests sent at once, each a
fresh 1,000-token profile and 8 items of 100 tokens (random token ids), each request under
its own adapter ("4 adapters"), all under the first ("1 adapter"), or none ("base"). The
three bursts alternate in each round; median (min-max) over --rounds after a warm-up
round. Stock SGLang 0.5.23 cannot run LoRA on a CPU (it pins host memory: sglang #31894),
so no stock row.
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
    add_shape_arguments(parser, requests=4, rounds=3)
    args = parser.parse_args()
    from prefillonly_sgl import Engine
    from prefillonly_sgl.models.default_model import default_model_path
    from prefillonly_sgl.models.tiny_adapters import build_lora_adapter

    bursts = Bursts(args)
    base = str(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"adapter{i}" for i in range(args.requests)]
        specs = [
            f"{name}={build_lora_adapter(base, Path(tmp) / name, seed=i)[0]}"
            for i, name in enumerate(names)
        ]
        kinds = {
            f"{args.requests} adapters": names,
            "1 adapter": [names[0]] * args.requests,
            "base": [None] * args.requests,
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        with Engine(
            base,
            dtype=args.dtype,
            enable_lora=True,
            lora_paths=specs,
            max_loras_per_batch=args.requests,
        ) as engine:
            for round_ in range(args.rounds + 1):
                order = list(kinds)[round_ % len(kinds) :] + list(kinds)[: round_ % len(kinds)]
                for kind in order:
                    seconds = bursts.seconds(engine, label_token_ids=LABELS, lora_path=kinds[kind])
                    if round_:
                        times[kind].append(seconds)
                    print(f"  round {round_} {kind}: {seconds:.2f} s", flush=True)
    print(
        f"\n{args.requests} requests at once, each a {args.profile_tokens}-token profile and "
        f"{args.items} items of {args.item_tokens} tokens, {args.dtype}; median (min-max) of "
        f"{args.rounds} rounds:"
    )
    for kind, values in times.items():
        print(f"- {kind}: {spread(values)} s")
    many, one = (statistics.median(times[k]) for k in list(kinds)[:2])
    print(f"- {args.requests} adapters / 1 adapter: {many / one:.2f}x")
    print(f"- 1 adapter / base: {one / statistics.median(times['base']):.2f}x")


if __name__ == "__main__":
    main()
