"""The MovieLens ranking job on Ray Data next to the local batch runner, on this machine:
the local runner (one engine), then Ray with 1 and 2 engine actors (the machine's CPUs
split between them); wall time with engine start, records/s, prefix-cache hit share and
the largest score difference from the local run.

    python examples/ray_batch.py [--users 30] [--negatives 9] [--model FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from prefillonly_sgl import Engine
from prefillonly_sgl.batch import run_batch
from prefillonly_sgl.pipelines import movielens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--negatives", type=int, default=9)
    parser.add_argument("--profile-films", type=int, default=40)
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--actors", default="1,2", help="Ray pool sizes to run (1,2)")
    args = parser.parse_args()
    import ray

    records, _ = movielens.build_records(args.users, args.negatives, args.profile_films)
    keep = ["user", "movie"]
    folder = Path(tempfile.mkdtemp(prefix="ray-batch-"))
    rows = []

    started = time.perf_counter()
    with Engine(args.model, device="cpu", dtype=args.dtype) as engine:
        local = run_batch(movielens.recommend, records, folder / "local.jsonl", engine=engine,
                          keep=keep, progress=False)  # fmt: skip
    wall = time.perf_counter() - started
    want = {json.loads(x)["row"]: json.loads(x)["score"]
            for x in (folder / "local.jsonl").read_text().splitlines()}  # fmt: skip
    rows.append(("local runner (1 engine)", wall, local.scored, local.cache_hit_share, 0.0))

    cpus = os.cpu_count() or 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    engine_options = {"model": args.model, "device": "cpu", "dtype": args.dtype}
    for actors in (int(a) for a in args.actors.split(",")):
        started = time.perf_counter()
        result = run_batch(movielens.recommend, records, None, executor="ray",
                           engine=engine_options, keep=keep, progress=False,
                           ray={"replicas": actors, "num_cpus": cpus / actors})  # fmt: skip
        wall = time.perf_counter() - started
        got = {r["row"]: r["score"] for r in result.results.take_all()}
        diff = max(abs(got[k] - want[k]) for k in want)
        rows.append((f"Ray Data, {actors} actor(s)", wall, result.scored,
                     result.cache_hit_share, diff))  # fmt: skip
    ray.shutdown()

    print(f"\n{len(records)} records ({args.users} users x {args.negatives + 1} films), "
          f"{cpus} CPUs\n")  # fmt: skip
    print("| run | wall (engine start included) | records/s | prefix-cache hits | "
          "max abs score diff vs local |\n|---|---|---|---|---|")  # fmt: skip
    for name, wall, scored, share, diff in rows:
        print(f"| {name} | {wall:.1f} s | {scored / wall:.2f} | {share:.0%} | {diff:.1e} |")


if __name__ == "__main__":
    main()
