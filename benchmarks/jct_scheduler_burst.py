"""The JCT scheduler on a recommendation burst, side by side in one run (issue 11).

Workload: U users, each a ~P-token profile (real drug-review text a user wrote, the
score request's query) scored against I items of ~T tokens (other reviews: "would this
user find it helpful?"), one /v1/score request per (user, item), all U*I sent at once in
shuffled order. Systems, each a real server started here on localhost, the prefix cache
flushed before each run:

  stock-fcfs     python -m sglang.launch_server --schedule-policy fcfs   (SGLang's default)
  stock-spf      python -m sglang.launch_server --schedule-policy shortest-prefill-first
  ours-fcfs      prefillonly serve --schedule-policy fcfs   (prefill-only attention + KV)
  ours-jct       prefillonly serve                          (+ the JCT scheduler: default)
  ideal          the ours-jct server, requests sent in the ideal order: per user, one item
                 alone, then its others together; latency still counted from the burst start

Per system: wall time, mean / P50 / P99 latency, prompt tokens computed (not cached). The
ratios the issue asks for: ours-jct mean / ideal mean, wall / ideal wall, P99 / stock-fcfs P99.

    .venv/bin/python benchmarks/jct_scheduler_burst.py            # ~15 min on the 2-core CPU
    .venv/bin/python benchmarks/jct_scheduler_burst.py --users 4 --items 3 --systems ours-jct ideal
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from harness.servers import Server, free_port

from prefillonly_sgl.data.drug_reviews import load_drug_reviews
from prefillonly_sgl.models.default_model import default_model_path

SYSTEMS = ("stock-fcfs", "stock-spf", "ours-fcfs", "ours-jct", "ideal")
RESULTS = Path(__file__).resolve().parent / "results"


def server_command(system: str, model: str, port: int, args) -> list[str]:
    common = ["--model-path", model, "--dtype", args.dtype, "--port", str(port),
              "--host", "127.0.0.1", "--max-total-tokens", str(args.pool)]  # fmt: skip
    if system.startswith("stock"):
        policy = "fcfs" if system == "stock-fcfs" else "shortest-prefill-first"
        return [sys.executable, "-m", "sglang.launch_server", *common, "--device", "cpu",
                "--attention-backend", "torch_native", "--skip-server-warmup",
                "--schedule-policy", policy, "--enable-cache-report"]  # fmt: skip
    policy = ["--schedule-policy", "fcfs"] if system == "ours-fcfs" else []
    return [sys.executable, "-m", "prefillonly_sgl", "serve", *common, *policy,
            "--skip-server-warmup"]  # fmt: skip


def workload(tokenizer, args) -> tuple[list[dict], list[int]]:
    """One dict per (user, item): query (the user's profile), item, user."""
    reviews = [r for split in ("train", "test") for r in load_drug_reviews(split)]
    random.Random(args.seed).shuffle(reviews)
    pool = itertools.cycle(reviews)  # ~100k tokens: reused only by very large workloads

    def text_of(tokens: int, head: str) -> str:
        text = head
        while len(tokenizer.encode(text)) < tokens:
            text += next(pool).text.replace("\n", " ") + "\n"
        ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
        return tokenizer.decode(ids)

    requests = []
    for user in range(args.users):
        profile = text_of(args.profile_tokens, f"Reviews written by user {user}:\n") + "\n"
        for item in range(args.items):
            body = text_of(args.item_tokens, "")
            item_text = f"New review: {body}\nWould this user find it helpful? Answer Yes or No:"
            requests.append({"user": user, "item": item, "query": profile, "item_text": item_text})
    labels = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    return requests, labels


async def score(session, url, request, labels, started) -> dict:
    body = {"query": request["query"], "items": [request["item_text"]],
            "label_token_ids": labels, "apply_softmax": True}  # fmt: skip
    async with session.post(url + "/v1/score", json=body) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer}")
    usage = answer.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "user": request["user"],
        "item": request["item"],
        "latency": time.perf_counter() - started,
        "prompt_tokens": usage.get("prompt_tokens") or 0,
        "cached_tokens": cached,
    }


async def burst(url, requests, labels, seed: int) -> list[dict]:
    order = list(requests)
    random.Random(seed).shuffle(order)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        started = time.perf_counter()
        return await asyncio.gather(*(score(s, url, r, labels, started) for r in order))


async def ideal(url, requests, labels) -> list[dict]:
    """Per user: one item alone (computes the profile), then the others together."""
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        started = time.perf_counter()
        rows = []
        for user in sorted({r["user"] for r in requests}):
            mine = [r for r in requests if r["user"] == user]
            rows.append(await score(s, url, mine[0], labels, started))
            rows += await asyncio.gather(*(score(s, url, r, labels, started) for r in mine[1:]))
        return rows


def summary(name: str, rows: list[dict]) -> dict:
    latencies = sorted(r["latency"] for r in rows)
    p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
    computed = sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows)
    return {
        "system": name,
        "wall": max(latencies),
        "mean": statistics.mean(latencies),
        "p50": statistics.median(latencies),
        "p99": p99,
        "computed_tokens": computed,
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--profile-tokens", type=int, default=1500)
    parser.add_argument("--item-tokens", type=int, default=100)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--pool", type=int, default=65536, help="KV pool tokens")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--model", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model = str(args.model or default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests, labels = workload(tokenizer, args)
    print(
        f"[burst] {len(requests)} requests: {args.users} users x {args.items} items, "
        f"profiles ~{args.profile_tokens} tokens, items ~{args.item_tokens}",
        flush=True,
    )
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = []
    servers: dict[str, Server] = {}
    for name in args.systems:
        server_name = "ours-jct" if name == "ideal" else name
        if server_name not in servers:
            for other in list(servers):  # one server at a time: they share 2 cores
                servers.pop(other).stop()
            port = free_port()
            log = RESULTS / f"jct_burst-{stamp}-{server_name}.log"
            print(f"[burst] {server_name}: starting", flush=True)
            servers[server_name] = Server(server_command(server_name, model, port, args), port, log)
            servers[server_name].wait_ready()
        server = servers[server_name]
        server.flush_cache()
        asyncio.run(burst(server.url, requests[:1], labels, 0))  # warm-up (then flushed)
        server.flush_cache()
        print(f"[burst] {name}: running", flush=True)
        if name == "ideal":
            rows = asyncio.run(ideal(server.url, requests, labels))
        else:
            rows = asyncio.run(burst(server.url, requests, labels, args.seed))
        results.append(summary(name, rows))
        r = results[-1]
        print(
            f"[burst] {name}: wall {r['wall']:.1f} s, mean {r['mean']:.1f} s, "
            f"P99 {r['p99']:.1f} s, computed {r['computed_tokens']} tokens",
            flush=True,
        )
    for server in servers.values():
        server.stop()

    by = {r["system"]: r for r in results}
    print(f"\n{'system':<11} {'wall s':>8} {'mean s':>8} {'P50 s':>8} {'P99 s':>8} {'computed':>9}")
    for r in results:
        print(f"{r['system']:<11} {r['wall']:>8.1f} {r['mean']:>8.1f} {r['p50']:>8.1f} "
              f"{r['p99']:>8.1f} {r['computed_tokens']:>9}")  # fmt: skip
    if "ours-jct" in by and "ideal" in by:
        jct, best = by["ours-jct"], by["ideal"]
        print(f"ours-jct / ideal: mean {jct['mean'] / best['mean']:.2f}x (target <= 1.15), "
              f"wall {jct['wall'] / best['wall']:.2f}x (target <= 1.05)")  # fmt: skip
    if "ours-jct" in by and "stock-fcfs" in by:
        print(
            f"ours-jct P99 / stock-fcfs P99: {by['ours-jct']['p99'] / by['stock-fcfs']['p99']:.2f}x"
        )
    out = RESULTS / f"jct_burst-{stamp}.json"
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"[burst] results: {out}")


if __name__ == "__main__":
    main()
