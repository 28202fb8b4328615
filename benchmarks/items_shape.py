"""What a forward costs, on CPU: SGLang #9748's items shape and the long-item burst, ours
against stock, with the forwards each request took (issue 62).

Shapes (random token ids, seeded: the work, the cache and the scheduling are what is
measured, as in gpu_engine.py):

- items: SGLang #9748's request, a 120-token query and 10 items of 180 tokens, every
  request its own query (nothing shared across requests);
- long-items: users with ~1.2k-token profiles, each request one user's profile and 8 items
  of 150 tokens, two requests per user (the second a cache hit on the profile).

Systems, each an Engine started in this process, one at a time, on the same model and
dtype (the default model, bf16, unless told otherwise):

  stock     every prefillonly feature off, SGLang's lpm policy (its best for shared
            prefixes; SGLang's multi-item scoring needs FlashInfer: GPU only)
  unpacked  ours, with followers waiting a forward for their leader's prefix
            (PREFILLONLY_PACK_FOLLOWERS=0: the engine before issue 62)
  ours      ours: a query and its items in one forward (prefill_kv/packing.py)

Per system and shape: a warm-up of two requests, then `--alone` requests one at a time
(latency p50 / p99: what one user waiting alone sees) and a burst of `--burst` requests
sent at once (items/s, p50 / p99). The scheduler's forward log (PREFILLONLY_FORWARD_LOG,
no timers) counts the extend forwards of each phase, hence forwards per request, and the
tokens they computed. Repeats (`--repeats`) give the spread.

    PYTHONPATH=. .venv/bin/python benchmarks/items_shape.py               # ~15 min, 2 cores
    PYTHONPATH=. .venv/bin/python benchmarks/items_shape.py --shapes items --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import engine_loadgen, stats  # noqa: E402
from harness.engine_loadgen import ScoreCall  # noqa: E402

SYSTEMS = ("stock", "unpacked", "ours")
SHAPES = ("items", "long-items")
OUT = HERE / "items_results"


def calls_for(shape: str, n: int, vocab: int, seed: int) -> list[ScoreCall]:
    """n requests of the shape; token ids in [10, vocab)."""
    rng = random.Random(seed)

    def ids(k):
        return [rng.randrange(10, vocab) for _ in range(k)]

    labels = [11, 12]
    if shape == "items":
        return [ScoreCall(ids(120), [ids(180) for _ in range(10)], labels) for _ in range(n)]
    users = [ids(rng.randrange(1100, 1300)) for _ in range((n + 1) // 2)]
    calls = [ScoreCall(users[i // 2], [ids(150) for _ in range(8)], labels) for i in range(n)]
    return calls


def start(system: str, model: str, dtype: str, log: Path):
    from prefillonly_sgl import STOCK_SGLANG, Engine
    from prefillonly_sgl.machine.environment import FORWARD_LOG, PACK_FOLLOWERS

    os.environ[FORWARD_LOG] = str(log)  # read by the engine's scheduler at its start
    if system == "unpacked":
        os.environ[PACK_FOLLOWERS] = "0"
    try:
        kwargs = dict(STOCK_SGLANG, schedule_policy="lpm") if system == "stock" else {}
        return Engine(model, device="cpu", dtype=dtype, **kwargs)
    finally:
        os.environ.pop(FORWARD_LOG, None)
        os.environ.pop(PACK_FOLLOWERS, None)


def forwards(log: Path) -> list[dict]:
    from prefillonly_sgl.hooking.events import read_events

    return read_events(log, "forward")


def phase(engine, log: Path, calls: list[ScoreCall], at_once: bool) -> dict:
    """The calls one at a time, or all at once; latencies, items/s and the forwards."""
    before = len(forwards(log))
    if at_once:
        outcomes, wall = engine_loadgen.run(engine, calls, [0.0] * len(calls), 3600)
    else:
        outcomes, wall = [], 0.0
        for call in calls:
            one, seconds = engine_loadgen.run(engine, [call], [0.0], 3600)
            outcomes += one
            wall += seconds
    row = stats.summarize(outcomes, wall)
    done = forwards(log)[before:]
    items = sum(len(c.items) for c in calls)
    row.update(
        items_per_s=items / wall,
        forwards=len(done),
        forwards_per_request=len(done) / len(calls),
        computed_tokens=sum(sum(f["new"]) for f in done),
        requests_per_forward=statistics.fmean(len(f["new"]) for f in done) if done else 0,
    )
    return row


def run_system(system: str, args, shapes: list[str]) -> dict:
    log = Path(tempfile.mkdtemp()) / "forwards.jsonl"
    engine = start(system, args.model, args.dtype, log)
    vocab = min(engine.tokenizer.vocab_size, 30000)
    results = {}
    try:
        for shape in shapes:
            rows = []
            for rep in range(args.repeats):
                seed = 1000 * rep + SHAPES.index(shape)
                # Every phase's prompts are new random ids: nothing is cached across phases.
                warm = calls_for(shape, 2, vocab, seed + 500)
                phase(engine, log, warm, at_once=False)  # every kernel and shape seen once
                alone = phase(engine, log, calls_for(shape, args.alone, vocab, seed), False)
                burst = phase(engine, log, calls_for(shape, args.burst, vocab, seed + 1), True)
                rows.append({"alone": alone, "burst": burst})
                print(
                    f"[items_shape] {system} {shape} #{rep}: alone p50 "
                    f"{alone['p50']:.3f} s, {alone['forwards_per_request']:.2f} fwd/req; "
                    f"burst {burst['items_per_s']:.1f} items/s, p99 {burst['p99']:.2f} s, "
                    f"{burst['forwards_per_request']:.2f} fwd/req",
                    flush=True,
                )
            results[shape] = rows
    finally:
        engine.shutdown()
    return results


def median_of(rows, part, key):
    values = [r[part][key] for r in rows]
    return statistics.median(values), min(values), max(values)


def table(results: dict, shapes: list[str]) -> str:
    lines = []
    for shape in shapes:
        lines += [
            f"\n### {shape}\n",
            "| system | alone p50 s | alone fwd/req | burst items/s | burst p50 s | burst p99 s "
            "| burst fwd/req | tokens computed (burst) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        base = None
        for system, by_shape in results.items():
            rows = by_shape[shape]

            def cell(part, key, fmt, rows=rows):
                mid, lo, hi = median_of(rows, part, key)
                spread = f" ({lo:{fmt}}-{hi:{fmt}})" if len(rows) > 1 else ""
                return f"{mid:{fmt}}{spread}"

            ips = median_of(rows, "burst", "items_per_s")[0]
            base = base or (ips if system == "stock" else None)
            ratio = f" **{ips / base:.2f}x**" if base and system != "stock" else ""
            lines.append(
                f"| {system} | {cell('alone', 'p50', '.3f')} | "
                f"{cell('alone', 'forwards_per_request', '.2f')} | "
                f"{cell('burst', 'items_per_s', '.1f')}{ratio} | {cell('burst', 'p50', '.2f')} | "
                f"{cell('burst', 'p99', '.2f')} | {cell('burst', 'forwards_per_request', '.2f')} | "
                f"{int(median_of(rows, 'burst', 'computed_tokens')[0]):,} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--alone", type=int, default=6, help="requests one at a time")
    parser.add_argument("--burst", type=int, default=12, help="requests sent at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.model is None:
        from prefillonly_sgl.models.default_model import default_model_path

        args.model = str(default_model_path())
    started = time.time()
    results = {system: run_system(system, args, args.shapes) for system in args.systems}
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: str(v) for k, v in vars(args).items()}
    meta["seconds"] = round(time.time() - started)
    (args.out / "results.json").write_text(json.dumps({"args": meta, "results": results}))
    md = table(results, args.shapes)
    (args.out / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
