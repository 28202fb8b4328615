"""Faults in a Ray batch job (issue 26): an engine actor SIGKILLed mid-job (twice), and the
driver SIGKILLed mid-job then the same `prefillonly batch --ray` command run again.

One local Ray cluster (2 CPUs, 2 engine actors of 1 CPU each), the default model, a
recommendation job (`--users` profiles of ~250 tokens x `--items` films, the soak app's
`film_fits` ranker), `--bucket-size` records per bucket. Three runs of the same job:
- clean: no fault (the reference time and bucket count);
- actor killed: one actor SIGKILLed when the first bucket is written and another when
  half of the clean run's buckets are: rows written, written exactly once, missing;
- driver killed: the CLI's driver SIGKILLed when half the buckets are written, then the
  same command again: rows written before the kill, rows the rerun scored (must be the
  rest, none rescored), rows exactly once, seconds in all.

    python benchmarks/ray_faults.py            # ~5 min
    python benchmarks/ray_faults.py --smoke    # 48 records, ~4 min

Results: benchmarks/ray_faults_results/ (summary.md, results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefillonly_sgl.batch import run_batch  # noqa: E402
from prefillonly_sgl.models.default_model import default_model_path  # noqa: E402

OUT = ROOT / "benchmarks" / "ray_faults_results"
APP = ROOT / "benchmarks" / "harness" / "soak_app.py"
LIKES = ["space operas", "french cooking", "jazz", "mountain birds", "old trains", "maps",
         "chess", "gardens", "sailing", "tea", "poetry", "robots"]  # fmt: skip
FILMS = ["Alien", "Amelie", "Heat", "Up", "Jaws", "Brazil", "Fargo", "Ran", "Her", "Coco"]


def records(users: int, items: int) -> list[dict]:
    rows = []
    for u in range(users):
        like = LIKES[u % len(LIKES)]
        profile = f"User {u} profile: " + " ".join(
            f"Rated a film about {like} {k % 5 + 1} of 5, liked the {like}." for k in range(12)
        ) + "\n"  # fmt: skip
        rows += [{"id": f"{u}-{i}", "query": profile, "document": FILMS[(u + i) % len(FILMS)]}
                 for i in range(items)]  # fmt: skip
    return rows


def bucket_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*")) if folder.is_dir() else []


def written_rows(folder: Path) -> list[int]:
    """Every row in the folder's bucket files (JSON lines), repeats included."""
    return [json.loads(line)["row"] for f in bucket_files(folder) for line in f.open()]


def exactly_once(folder: Path, total: int) -> dict:
    counts = Counter(written_rows(folder))
    return {"rows_written": sum(counts.values()), "distinct": len(counts),
            "twice_or_more": sum(1 for c in counts.values() if c > 1),
            "missing": total - len(counts & Counter(range(total)))}  # fmt: skip


def wait_for_buckets(folder: Path, n: int, alive) -> float:
    while len(bucket_files(folder)) < n:
        if not alive():
            raise RuntimeError(f"the job ended before {n} buckets were written")
        time.sleep(0.01)
    return time.monotonic()


def engine_actors() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "MapWorker" in " ".join(p.info["cmdline"] or [])]  # fmt: skip


def clean_run(source: Path, out: Path, engine: dict, ray_options: dict) -> dict:
    report = run_batch(film_fits(), source, out, executor="ray", engine=engine,
                       progress=False, ray=ray_options)  # fmt: skip
    return {"seconds": report.seconds, "scored": report.scored, "buckets": len(bucket_files(out))}


def actor_killed_run(source, out, engine, ray_options, total, buckets) -> dict:
    result, kills = {}, []

    def job():
        result["report"] = run_batch(film_fits(), source, out, executor="ray", engine=engine,
                                     progress=False, ray=ray_options)  # fmt: skip

    started = time.monotonic()
    thread = threading.Thread(target=job)
    thread.start()
    for when in (1, max(2, buckets // 2)):
        wait_for_buckets(out, when, thread.is_alive)
        actors = engine_actors()
        actors[0].send_signal(signal.SIGKILL)
        kills.append({"after_buckets": len(bucket_files(out)), "actors_alive": len(actors),
                      "at_s": time.monotonic() - started})  # fmt: skip
    thread.join()
    report = result["report"]
    return {"seconds": report.seconds, "scored": report.scored, "errors": report.errors,
            "kills": kills, **exactly_once(out, total)}  # fmt: skip


def driver_killed_run(source, out, model, address, bucket_size, total, buckets) -> dict:
    command = [sys.executable, "-m", "prefillonly_sgl", "batch", f"{APP}:film_fits",
               str(source), str(out), "--model", str(model), "--device", "cpu", "--ray",
               address, "--replicas", "2", "--bucket-size", str(bucket_size),
               "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    wait_for_buckets(out, max(1, buckets // 2), lambda: driver.poll() is None)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    killed_at = time.monotonic() - started
    before = exactly_once(out, total)
    rerun_start = time.monotonic()
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    summary = again.stdout.strip().splitlines()[-1]
    scored, done = (int(x) for x in re.search(r"(\d+) scored on Ray.*?(\d+) already done",
                                              summary).groups())  # fmt: skip
    return {"killed_at_s": killed_at, "rows_before_kill": before["rows_written"],
            "rerun_scored": scored, "rerun_skipped": done,
            "rerun_seconds": time.monotonic() - rerun_start,
            "seconds_in_all": time.monotonic() - started, "rerun_summary": summary,
            **exactly_once(out, total)}  # fmt: skip


def film_fits():
    sys.path.insert(0, str(APP.parent))
    from soak_app import film_fits as function

    return function


def summary_md(settings: dict, results: dict) -> str:
    clean, actor, driver = results["clean"], results["actor_killed"], results["driver_killed"]
    total = settings["records"]
    lines = [
        "# Faults in a Ray batch job", "", "```", json.dumps(settings, indent=1), "```", "",
        f"{total} records, {clean['buckets']} buckets (clean run: {clean['seconds']:.1f} s).", "",
        "| run | rows written | exactly once | twice or more | missing | rescored | seconds |",
        "|---|---|---|---|---|---|---|",
        f"| clean | {total} | {total} | 0 | 0 | - | {clean['seconds']:.1f} |",
        f"| 2 actors SIGKILLed (after {', '.join(str(k['after_buckets']) for k in actor['kills'])}"
        f" buckets) | {actor['rows_written']} | {actor['distinct']} | {actor['twice_or_more']} | "
        f"{actor['missing']} | - | {actor['seconds']:.1f} |",
        f"| driver SIGKILLed ({driver['rows_before_kill']} rows written), same command again "
        f"| {driver['rows_written']} | {driver['distinct']} | {driver['twice_or_more']} | "
        f"{driver['missing']} | {driver['rerun_scored'] + driver['rows_before_kill'] - total} "
        f"| {driver['seconds_in_all']:.1f} |",
        "", f"Rerun: `{driver['rerun_summary']}`",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=48)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--bucket-size", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="12 users x 4 items, buckets of 2")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.smoke:
        args.users, args.items, args.bucket_size = 12, 4, 2
    import ray

    model = default_model_path()
    rows = records(args.users, args.items)
    settings = {"model": str(model), "users": args.users, "items": args.items,
                "records": len(rows), "bucket_size": args.bucket_size, "replicas": 2,
                "cpus": 2}  # fmt: skip
    engine = {"model": str(model), "device": "cpu"}
    ray_options = {"replicas": 2, "bucket_size": args.bucket_size}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    address = ray.get_runtime_context().gcs_address
    results = {}
    with tempfile.TemporaryDirectory(prefix="ray-faults-") as tmp:
        tmp = Path(tmp)
        source = tmp / "records.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in rows))
        results["clean"] = clean_run(source, tmp / "clean.jsonl", engine, ray_options)
        buckets = results["clean"]["buckets"]
        print(f"[clean] {results['clean']}", flush=True)
        results["actor_killed"] = actor_killed_run(source, tmp / "actor.jsonl", engine,
                                                   ray_options, len(rows), buckets)  # fmt: skip
        print(f"[actor killed] {results['actor_killed']}", flush=True)
        results["driver_killed"] = driver_killed_run(
            source, tmp / "driver.jsonl", model, address, args.bucket_size, len(rows), buckets
        )
        print(f"[driver killed] {results['driver_killed']}", flush=True)
    ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"settings": settings, **results}, indent=1))
    (args.out / "summary.md").write_text(summary_md(settings, results))
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
