"""LoRA adapters per request (issue 76): a burst of 4 adapters x 8 items behind one profile
per adapter, against the same burst under one adapter (and under none), on ours.

    .venv/bin/python benchmarks/lora_burst.py          # ~4 min, float32, CPU

Four r=8 adapters of every projection of the default model, made with peft (random
weights: speed only). A burst: 4 requests sent at once, each a fresh 1,000-token profile
and 8 items of 100 tokens (random token ids), each request under its own adapter
("4 adapters"), all under the first ("1 adapter"), or none ("base"). The three bursts
alternate in each round; median (min-max) over --rounds after a warm-up round. Stock
SGLang 0.5.23 cannot run LoRA on a CPU (it pins host memory: sglang #31894), so no stock
row.
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
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapters(base: str, out: Path, n: int) -> list[str]:
    """n random r=8 adapters of `base`, as name=path strings for lora_paths."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    specs = []
    for i in range(n):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
        get_peft_model(model, config).save_pretrained(out / f"adapter{i}")
        specs.append(f"adapter{i}={out / f'adapter{i}'}")
    return specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--profile-tokens", type=int, default=1000)
    parser.add_argument("--item-tokens", type=int, default=100)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from prefillonly_sgl import Engine
    from prefillonly_sgl.models.default_model import default_model_path

    rng = random.Random(76)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(200, 40000) for _ in range(n)]

    def burst(engine, adapters: list[str | None]) -> float:
        requests = [
            (tokens(args.profile_tokens), [tokens(args.item_tokens) for _ in range(args.items)])
            for _ in adapters
        ]

        async def all_at_once():
            return await asyncio.gather(
                *(
                    engine.async_score(profile, items, LABELS, lora_path=adapter)
                    for (profile, items), adapter in zip(requests, adapters, strict=True)
                )
            )

        started = time.perf_counter()
        engine.run_until_complete(all_at_once())
        return time.perf_counter() - started

    base = str(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        specs = make_adapters(base, Path(tmp), args.adapters)
        names = [spec.split("=")[0] for spec in specs]
        kinds = {
            f"{args.adapters} adapters": names,
            "1 adapter": [names[0]] * args.adapters,
            "base": [None] * args.adapters,
        }
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        with Engine(
            base,
            dtype=args.dtype,
            enable_lora=True,
            lora_paths=specs,
            max_loras_per_batch=args.adapters,
        ) as engine:
            for round_ in range(args.rounds + 1):
                order = list(kinds)[round_ % len(kinds) :] + list(kinds)[: round_ % len(kinds)]
                for kind in order:
                    seconds = burst(engine, kinds[kind])
                    if round_:
                        times[kind].append(seconds)
                    print(f"  round {round_} {kind}: {seconds:.2f} s", flush=True)
    print(
        f"\n{args.adapters} requests at once, each a {args.profile_tokens}-token profile and "
        f"{args.items} items of {args.item_tokens} tokens, {args.dtype}; median (min-max) of "
        f"{args.rounds} rounds:"
    )
    for kind, values in times.items():
        print(f"- {kind}: {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
    many, one = (statistics.median(times[k]) for k in list(kinds)[:2])
    print(f"- {args.adapters} adapters / 1 adapter: {many / one:.2f}x")
    print(f"- 1 adapter / base: {one / statistics.median(times['base']):.2f}x")


if __name__ == "__main__":
    main()
