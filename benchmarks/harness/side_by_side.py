"""Ours and stock SGLang as two Engines in one process, taking turns (the images and
moderation benchmarks): each started the same way, each unit warmed, then rounds in a
rotating order so that drifts in the machine's speed hit every system alike.

    engine = start_engine("images", "stock", model, pool, "lpm")
    rows = rotating_rounds("images", units, rounds=5, warmup=2)  # {system: [row, ...]}
"""

from __future__ import annotations

import os
import platform


def start_engine(tag: str, system: str, model: str, pool: int, stock_policy: str):
    """An Engine on CPU in float32: ours (every feature), or stock SGLang as shipped
    (STOCK_SGLANG) under ``stock_policy``."""
    from prefillonly_sgl import STOCK_SGLANG, Engine

    settings = dict(STOCK_SGLANG, schedule_policy=stock_policy) if system == "stock" else {}
    print(f"[{tag}] starting {system} on {model}", flush=True)
    return Engine(model, device="cpu", dtype="float32", max_total_tokens=pool, **settings)


def rotating_rounds(tag: str, units: dict, rounds: int, warmup: int) -> dict[str, list[dict]]:
    """Each unit (name: a function of the round's tag returning {system: row}, a row with
    "s", "prompt_tokens" and "computed_tokens" (None: not reported)) ``warmup`` times
    untimed (the CPU's compiled kernels settle only after a second shape), then
    ``rounds`` rounds in a rotating order; the rows per system."""
    for name, unit in units.items():
        for w in range(warmup):
            unit(f"warm{w}")
        print(f"[{tag}]   {name} warmed", flush=True)
    rows: dict[str, list[dict]] = {}
    names = list(units)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for system, row in units[name](str(r)).items():
                rows.setdefault(system, []).append(row)
                computed = row["computed_tokens"]
                print(
                    f"[{tag}]   round {r} {system}: {row['s']:.3f} s, computed "
                    f"{'n/r' if computed is None else computed} of {row['prompt_tokens']} "
                    "tokens",
                    flush=True,
                )
    return rows


def with_run_defaults(args, quick: dict, full: dict):
    """``args`` with the run's defaults (``quick`` under --quick, else ``full``) where the
    user gave no value."""
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def machine_line() -> str:
    """The machine as the results record it: architecture, cores, load now."""
    load = os.getloadavg()[0]
    return f"{platform.machine()}, {os.cpu_count()} cores, load {load:.1f}"
