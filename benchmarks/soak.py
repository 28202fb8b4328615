"""Soak: one `prefillonly serve` under mixed traffic at 70% of its saturation for 30 minutes
(bounded, localhost): every request's outcome and latency, and the server's resident
memory, over time.

Traffic (one mix, drawn per request): /v1/score (16 user profiles of ~300 tokens as the
shared query, 4 film items; 40%), /v1/score_labels with a label of two tokens (15%),
/v1/rerank (20%) and /v1/classify (15%) through DSL functions (harness/soak_app.py), and
malformed bodies (10%: each must get its 4xx). Saturation: the mix's throughput under
`--clients` closed-loop clients for `--saturate-seconds`, after `--warmup-seconds` of the
same, unmeasured: a cold server served the mix at 3.9/s over its first 20 s and at 8.2-9.8/s
over each of the next four 20 s (first shapes, an empty prefix cache). The soak: Poisson
arrivals at `--load` x that rate (open loop, at most 64 in flight) for `--minutes`; then
saturation again, the same way: a server that kept its speed serves the mix as fast after
the soak as before it (latency at 70% load moves a lot with a few percent of machine noise).

    python benchmarks/soak.py                 # default model, 30 min (~35 min in all)
    python benchmarks/soak.py --smoke         # tiny model, 30 s (~1.5 min in all)

Results: benchmarks/soak_results/ (summary.md, results.json, soak.png).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness.servers import Server, free_port  # noqa: E402
from harness.stats import quantile  # noqa: E402

OUT = ROOT / "benchmarks" / "soak_results"
APP = ROOT / "benchmarks" / "harness" / "soak_app.py"
LIKES = ["space operas", "french cooking", "jazz", "mountain birds", "old trains", "maps",
         "chess", "gardens", "sailing", "tea", "poetry", "robots", "castles", "rivers",
         "comets", "violins"]  # fmt: skip
FILMS = ["Alien", "Amelie", "Heat", "Up", "Jaws", "Brazil", "Fargo", "Ran", "Her", "Coco"]
REVIEWS = ["It stopped my migraines in a week.", "Terrible nausea, I quit after two days.",
           "Works, but the dry mouth is annoying.", "Best thing my doctor gave me."]  # fmt: skip
MALFORMED = [
    ("/v1/score", {"query": "x", "items": 5, "label_token_ids": [1]}),
    ("/v1/score", {"query": "x", "items": ["y"], "label_token_ids": [-4]}),
    ("/v1/score_labels", {"query": "x", "items": ["y"], "labels": []}),
    ("/v1/rerank", {"query": 5, "documents": ["a"]}),
    ("/v1/classify", {"input": []}),
]
MIX = [("score", 40), ("score_labels", 15), ("rerank", 20), ("classify", 15), ("bad", 10)]


def profile(user: int) -> str:
    like = LIKES[user % len(LIKES)]
    return f"User {user} profile: " + " ".join(
        f"Rated a film about {like} {k % 5 + 1} of 5 and wrote that the {like} were the best "
        f"part." for k in range(12)
    ) + "\n"  # fmt: skip


def request(rng: random.Random, label_ids: list[int]) -> tuple[str, str, dict]:
    """(kind, path, body) of one request of the mix."""
    kind = rng.choices([k for k, _ in MIX], [w for _, w in MIX])[0]
    user, films = rng.randrange(len(LIKES)), rng.sample(FILMS, 4)
    items = [f"Film: {f}. Will this user rate it 4/5 or more? Answer Yes or No:" for f in films]
    if kind == "score":
        return (
            kind,
            "/v1/score",
            {
                "query": profile(user),
                "items": items,
                "label_token_ids": label_ids,
                "apply_softmax": True,
            },
        )
    if kind == "score_labels":
        return (
            kind,
            "/v1/score_labels",
            {"query": profile(user), "items": items[:2], "labels": [" Yes", " No way"]},
        )
    if kind == "rerank":
        return kind, "/v1/rerank", {"query": profile(user), "documents": films}
    if kind == "classify":
        return kind, "/v1/classify", {"input": rng.sample(REVIEWS, 2)}
    path, body = rng.choice(MALFORMED)
    return kind, path, body  # fmt: skip


def send(url: str, kind: str, path: str, body: dict, t0: float) -> dict:
    start = time.monotonic()
    row = {"t": start - t0, "kind": kind}
    try:
        response = requests.post(url + path, json=body, timeout=300)
        row["status"] = response.status_code
        if response.status_code != 200:
            row["body"] = response.text[:200]
    except requests.RequestException as e:
        row["status"], row["body"] = "lost", f"{type(e).__name__}: {e}"[:200]
    row["latency"] = time.monotonic() - start
    # A malformed body must get a 4xx, every other one a 200.
    expected = (400 <= row["status"] < 500) if kind == "bad" else row["status"] == 200
    row["ok"] = bool(expected) if isinstance(row["status"], int) else False
    return row


def saturation(url: str, label_ids, clients: int, seconds: float) -> float:
    """Completed requests per second of the mix under `clients` closed-loop clients."""
    done, stop = [], time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(1000 + k)
        while time.monotonic() < stop:
            done.append(send(url, *request(rng, label_ids), t0=0.0))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(done) / (time.monotonic() - started)


def rss(pid: int) -> int:
    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def soak(server: Server, label_ids, rate: float, seconds: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    rows: list[dict] = []
    memory: list[tuple[float, int]] = []
    t0 = time.monotonic()
    stop = threading.Event()

    def sample_memory() -> None:
        while not stop.is_set():
            memory.append((time.monotonic() - t0, rss(server.proc.pid)))
            stop.wait(10)

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(max_workers=64) as pool:
        futures, at = [], 0.0
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            futures.append(pool.submit(send, server.url, *request(rng, label_ids), t0))
        rows = [f.result() for f in futures]
    stop.set()
    sampler.join()
    memory.append((time.monotonic() - t0, rss(server.proc.pid)))
    return {"rows": rows, "memory": memory}


def windows(result: dict, seconds: float, count: int = 6) -> list[dict]:
    out = []
    for i in range(count):
        lo, hi = seconds * i / count, seconds * (i + 1) / count
        rows = [r for r in result["rows"] if lo <= r["t"] < hi]
        good = [r["latency"] for r in rows if r["ok"] and r["kind"] != "bad"]
        mem = [m for t, m in result["memory"] if lo <= t < hi] or [result["memory"][-1][1]]
        out.append({"from_s": lo, "to_s": hi, "requests": len(rows),
                    "unexpected": sum(1 for r in rows if not r["ok"]),
                    "p50_s": quantile(good, 0.5) if good else None,
                    "p99_s": quantile(good, 0.99) if good else None,
                    "rss_mib": max(mem) / 2**20})  # fmt: skip
    return out


def markdown(
    config: dict, sat: float, rate: float, result: dict, table: list[dict], sat_after: float
) -> str:
    rows = result["rows"]
    bad = [r for r in rows if not r["ok"]]
    mem = [m for _, m in result["memory"]]
    lines = ["# Soak", "", "```", json.dumps(config, indent=1), "```", "",
             f"Saturation: {sat:.2f} requests/s (the mix, {config['clients']} closed-loop "
             f"clients); soak at {rate:.2f}/s ({config['load']:.0%}) for "
             f"{config['minutes']:g} min: {len(rows)} requests, {len(bad)} unexpected "
             f"outcomes; server memory {mem[0] / 2**20:.0f} -> {mem[-1] / 2**20:.0f} MiB "
             f"(max {max(mem) / 2**20:.0f}). Saturation after the soak: {sat_after:.2f}/s "
             f"({sat_after / sat - 1:+.1%}).", "",
             "| window | requests | unexpected | p50 | p99 | max RSS |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for w in table:
        p50 = "-" if w["p50_s"] is None else f"{w['p50_s']:.2f} s"
        p99 = "-" if w["p99_s"] is None else f"{w['p99_s']:.2f} s"
        lines.append(f"| {w['from_s'] / 60:.0f}-{w['to_s'] / 60:.0f} min | {w['requests']} | "
                     f"{w['unexpected']} | {p50} | {p99} | {w['rss_mib']:.0f} MiB |")  # fmt: skip
    if bad:
        lines += ["", "Unexpected: " + "; ".join(sorted({f"{r['status']} {r.get('body', '')}"
                                                         for r in bad}))[:2000]]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(result: dict, seconds: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    good = [r for r in result["rows"] if r["ok"] and r["kind"] != "bad"]
    top.scatter([r["t"] / 60 for r in good], [r["latency"] for r in good], s=3, alpha=0.4)
    per_minute = windows(result, seconds, count=max(1, round(seconds / 60)))
    medians = [((w["from_s"] + w["to_s"]) / 120, w["p50_s"]) for w in per_minute if w["p50_s"]]
    if medians:
        top.plot(*zip(*medians), color="black", label="median per minute")
    bad = [r for r in result["rows"] if not r["ok"]]
    if bad:
        top.scatter([r["t"] / 60 for r in bad], [r["latency"] for r in bad], s=12, marker="x",
                    color="red", label=f"unexpected ({len(bad)})")  # fmt: skip
    if bad or medians:
        top.legend()
    top.set_ylabel("latency (s)")
    top.set_yscale("log")
    top.set_title("Soak: mixed traffic at 70% of saturation")
    bottom.plot([t / 60 for t, _ in result["memory"]], [m / 2**20 for _, m in result["memory"]])
    bottom.set_ylabel("server RSS (MiB)")
    bottom.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--load", type=float, default=0.7, help="share of saturation")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--saturate-seconds", type=float, default=90)
    parser.add_argument("--warmup-seconds", type=float, default=60)
    parser.add_argument("--smoke", action="store_true", help="tiny model, 30 s")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    pool = 16384
    if args.smoke:
        from prefillonly_sgl.models.tiny import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
        args.minutes, args.saturate_seconds, args.warmup_seconds, pool = 0.5, 10, 5, 4096
    elif args.model is None:
        from prefillonly_sgl.models.default_model import default_model_path

        args.model = str(default_model_path())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    label_ids = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    port = free_port()
    command = [sys.executable, "-m", "prefillonly_sgl", "serve", "--model-path", args.model,
               "--port", str(port), "--host", "127.0.0.1", "--max-total-tokens", str(pool),
               "--app", str(APP), "--rerank", "film_fits", "--classify", "review_mood"]  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="soak-")) / "serve.log"
    server = Server(command, port, log)
    try:
        server.wait_ready()
        saturation(server.url, label_ids, args.clients, args.warmup_seconds)
        sat = saturation(server.url, label_ids, args.clients, args.saturate_seconds)
        rate = args.load * sat
        print(f"[soak] saturation {sat:.2f}/s; soaking at {rate:.2f}/s for {args.minutes} min")
        result = soak(server, label_ids, rate, args.minutes * 60)
        sat_after = saturation(server.url, label_ids, args.clients, args.saturate_seconds)
        print(f"[soak] saturation after the soak {sat_after:.2f}/s")
    finally:
        server.stop()
    table = windows(result, args.minutes * 60)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"config": config, "saturation_per_s": sat, "saturation_after_per_s": sat_after,
         "rate_per_s": rate, "windows": table,
         "memory": result["memory"], "rows": result["rows"]}))  # fmt: skip
    summary = markdown(config, sat, rate, result, table, sat_after)
    (args.out / "summary.md").write_text(summary)
    plot(result, args.minutes * 60, args.out / "soak.png")
    print(summary)
    return 0 if all(r["ok"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
