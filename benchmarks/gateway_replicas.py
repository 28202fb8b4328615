"""Replicas behind SGLang's gateway: prefix affinity per routing policy, and a replica killed
under load.

Two `prefillonly serve` replicas (`prefillonly replicas`' ReplicaSet) with three `smg`
gateways over the same replicas, one per policy: cache_aware (the default), consistent
hashing on a client routing key (`x-smg-routing-key: user`), round_robin.

affinity   MovieLens users (rating histories as the query, candidate films as documents,
           the workload's prompt as the ranker, harness/rerank_app.py) through
           /v1/rerank, every user once per round in a shuffled order, 2 clients;
           replicas' caches flushed before each policy. Per round: cached prompt tokens /
           prompt tokens as the replicas report them; mean latency; the answers' largest
           difference from one replica's.
kill       the cache-aware gateway, then the consistent-hashing one (routing key: the
           user), each under `--clients` closed-loop clients that never retry; replica 1
           SIGKILLed `--kills` times (each once the restarted replica is back in rotation,
           `--seconds` / 3 of calm before, between and after) and restarted by the
           supervisor. Every request's outcome (ok, HTTP error with its body, lost), when
           the gateway stopped and resumed routing to the replica, its retries
           (Prometheus), latency per phase.

    python benchmarks/gateway_replicas.py            # default model (~15 min on 2 cores)
    python benchmarks/gateway_replicas.py --smoke    # tiny model, a few requests

Results: benchmarks/gateway_results/ (summary.md, results.json, kill_timeline.png).
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

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness.stats import quantile  # noqa: E402
from harness.workloads import recommendation  # noqa: E402

from prefillonly_sgl.replicas.launcher import Gateway, ReplicaSet, free_port, free_port_run  # noqa: E402

OUT = ROOT / "benchmarks" / "gateway_results"
POLICIES = ("cache_aware", "consistent_hashing", "round_robin")


def users_from_workload(tokenizer, users: int, items: int, profile_tokens: int) -> list[dict]:
    """[{user, query, documents}] from the MovieLens recommendation workload."""
    workload = recommendation(tokenizer, users, items, profile_tokens)
    by_user: dict[int, dict] = {}
    for r in workload.requests:
        document = r["item"].split(". Will this fan")[0].removeprefix("Candidate: ")
        entry = by_user.setdefault(r["group"], {"user": r["group"], "query": r["query"],
                                                "documents": []})  # fmt: skip
        entry["documents"].append(document)
    return [by_user[k] for k in sorted(by_user)]


def call(url: str, user: dict, routing_key: bool = False, timeout: float = 600) -> dict:
    headers = {"x-smg-routing-key": f"user-{user['user']}"} if routing_key else {}
    start = time.monotonic()
    response = requests.post(f"{url}/v1/rerank", json={"query": user["query"],
                             "documents": user["documents"], "rid": None}, headers=headers,
                             timeout=timeout)  # fmt: skip
    latency = time.monotonic() - start
    if response.status_code != 200:
        raise requests.HTTPError(f"{response.status_code}: {response.text[:300]}",
                                 response=response)  # fmt: skip
    answer = response.json()
    results = answer["results"] if isinstance(answer, dict) else answer
    meta = results[0]["meta_info"]
    probs = [r["meta_info"]["probs"] for r in sorted(results, key=lambda r: r["index"])]
    return {"latency": latency, "prompt": meta["call_prompt_tokens"],
            "cached": meta["call_cached_tokens"], "probs": probs}  # fmt: skip


def flush(urls: list[str]) -> None:
    for url in urls:
        requests.post(f"{url}/flush_cache", timeout=600).raise_for_status()


def affinity(gateways: dict, replica_urls: list[str], users: list[dict], rounds: int,
             clients: int) -> dict:  # fmt: skip
    direct = {u["user"]: call(replica_urls[0], u)["probs"] for u in users}
    report = {}
    for policy, gateway in gateways.items():
        flush(replica_urls)
        rng = random.Random(7)
        per_round = []
        worst = 0.0
        for _ in range(rounds):
            order = rng.sample(users, len(users))
            with ThreadPoolExecutor(clients) as pool:
                answers = list(pool.map(lambda u, url=gateway.url, p=policy: call(
                    url, u, routing_key=p == "consistent_hashing"), order))  # fmt: skip
            for user, answer in zip(order, answers, strict=True):
                for got, want in zip(answer["probs"], direct[user["user"]], strict=True):
                    worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
            per_round.append({
                "cached_share": sum(a["cached"] for a in answers)
                / sum(a["prompt"] for a in answers),
                "mean_latency_s": sum(a["latency"] for a in answers) / len(answers),
            })  # fmt: skip
        report[policy] = {"rounds": per_round, "max_abs_diff_vs_one_replica": worst}
        shares = ", ".join(f"{r['cached_share']:.0%}" for r in per_round)
        print(f"[affinity] {policy:18s} cached share by round: {shares}  max|diff| {worst:.1e}")
    return report


def retries(metrics_text: str) -> float:
    """Requests the gateway retried on another attempt (smg_worker_retries_total, all
    series)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("smg_worker_retries_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def kill_run(replica_set: ReplicaSet, gateway: Gateway, users: list[dict], clients: int,
             seconds: float, kills: int = 3) -> dict:  # fmt: skip
    """Kill runs through ``gateway`` (its policy; consistent hashing with the user as
    routing key): `clients` closed-loop clients that never retry (a client that gets an
    error waits 0.2 s before its next request); replica 1 SIGKILLed `kills` times, each
    time once the gateway has taken the restarted replica back, `seconds` / 3 apart."""
    dead = replica_set.replica_urls[1]
    keyed = gateway.policy == "consistent_hashing"
    # The replica back in this gateway's rotation (after an earlier run's restart).
    deadline = time.monotonic() + 600
    while not gateway.all_registered() and time.monotonic() < deadline:
        time.sleep(1)
    outcomes: list[dict] = []
    events: list[dict[str, float]] = []  # per kill: killed, unrouted, back
    stop, done = threading.Event(), threading.Event()
    t0 = time.monotonic()
    retries_before = retries(gateway.metrics())

    def client(k: int) -> None:
        rng = random.Random(k)
        while not done.is_set():
            user = rng.choice(users)
            start = time.monotonic() - t0
            try:
                answer = call(gateway.url, user, routing_key=keyed, timeout=120)
                outcomes.append({"t": start, "latency": answer["latency"], "status": "ok"})
            except requests.HTTPError as e:
                outcomes.append({"t": start, "latency": time.monotonic() - t0 - start,
                                 "status": f"http {e.response.status_code}",
                                 "body": e.response.text[:300]})  # fmt: skip
                time.sleep(0.2)
            except requests.RequestException as e:
                outcomes.append({"t": start, "latency": time.monotonic() - t0 - start,
                                 "status": f"lost: {type(e).__name__}"})  # fmt: skip
                time.sleep(0.2)

    def monitor() -> None:
        while not done.is_set():
            healthy = dead in gateway.healthy_workers()
            now = time.monotonic() - t0
            if events and not healthy and "unrouted" not in events[-1]:
                events[-1]["unrouted"] = now
            if events and "unrouted" in events[-1] and healthy and "back" not in events[-1]:
                events[-1]["back"] = now
            time.sleep(0.25)

    supervisor = threading.Thread(target=replica_set.supervise, args=(stop,), daemon=True)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    threads.append(threading.Thread(target=monitor))
    supervisor.start()
    for t in threads:
        t.start()
    for _ in range(kills):
        time.sleep(seconds / 3)
        replica_set.kill_replica(1)
        events.append({"killed": time.monotonic() - t0})
        deadline = time.monotonic() + 600
        while "back" not in events[-1] and time.monotonic() < deadline:
            time.sleep(0.5)
    time.sleep(seconds / 3)
    done.set()
    for t in threads:
        t.join()
    stop.set()
    supervisor.join(timeout=10)

    def summary(rows: list[dict]) -> dict:
        ok = [o["latency"] for o in rows if o["status"] == "ok"]
        return {
            "requests": len(rows),
            "ok": len(ok),
            "failed": sum(1 for o in rows if o["status"].startswith("http")),
            "lost": sum(1 for o in rows if o["status"].startswith("lost")),
            "p50_s": quantile(ok, 0.5) if ok else None,
            "p99_s": quantile(ok, 0.99) if ok else None,
        }

    first = events[0]["killed"]
    phases = {"before the first kill": summary([o for o in outcomes if o["t"] < first])}
    for i, e in enumerate(events):
        back = e.get("back", float("inf"))
        rows = [o for o in outcomes if e["killed"] <= o["t"] < back]
        phases[f"kill {i + 1}: replica down"] = {
            **summary(rows),
            "unrouted_after_s": e.get("unrouted", float("nan")) - e["killed"],
            "back_after_s": back - e["killed"],
        }
    phases["all"] = summary(outcomes)
    metrics = gateway.metrics()
    report = {
        "policy": gateway.policy,
        "retry_series": [x for x in metrics.splitlines() if "retr" in x and not x.startswith("#")],
        "clients": clients,
        "seconds": seconds,
        "kills": kills,
        "events_s": events,
        "gateway_retries": retries(metrics) - retries_before,
        "phases": phases,
        "statuses": sorted({o["status"] for o in outcomes}),
        "errors": sorted(
            {o.get("body", o["status"])[:200] for o in outcomes if o["status"] != "ok"}
        ),
        "outcomes": outcomes,
    }
    print(f"[kill] {gateway.policy}: {phases['all']}; events {events}; "
          f"gateway retries {report['gateway_retries']:g}")  # fmt: skip
    return report


def markdown(config: dict, affinity_report: dict, kills: list[dict]) -> str:
    rounds = config["rounds"]
    lines = ["# Replicas behind SGLang's gateway", "", "```", json.dumps(config, indent=1),
             "```"]  # fmt: skip
    if affinity_report:  # none under --kill-only
        lines += ["", "## Prefix affinity (cached-token share per round)", "",
                  "Prefill work: tokens computed (prompt - cached) in rounds 2+, relative to "
                  "cache_aware (the same requests for every policy).", "",
                  "| policy | " + " | ".join(f"round {i + 1}" for i in range(rounds))
                  + " | prefill work, rounds 2+ | mean latency, last round "
                  "| max abs diff vs one replica |",
                  "|---" * (rounds + 4) + "|"]  # fmt: skip
    base = _uncached(affinity_report["cache_aware"]["rounds"][1:]) if affinity_report else 0
    for policy, r in affinity_report.items():
        shares = " | ".join(f"{x['cached_share']:.0%}" for x in r["rounds"])
        work = _uncached(r["rounds"][1:]) / base if base else float("nan")
        lines.append(f"| {policy} | {shares} | {work:.2f}x | "
                     f"{r['rounds'][-1]['mean_latency_s']:.2f} s | "
                     f"{r['max_abs_diff_vs_one_replica']:.1e} |")  # fmt: skip
    for kill in kills:
        key = " (routing key: the user)" if kill["policy"] == "consistent_hashing" else ""
        lines += ["", f"## Replica 1 killed {kill['kills']}x under load: "
                  f"{kill['policy']}{key}, {kill['clients']} clients", "",
                  "Clients never retry; a client waits 0.2 s after an error. Recovery: the "
                  "gateway's health checks take the dead replica out, the supervisor "
                  "restarts it, the gateway takes it back. Gateway retries: "
                  f"{kill['gateway_retries']:g}.", "",
                  "| phase | requests | ok | failed (HTTP error) | lost (no answer) | p50 "
                  "| p99 | out of rotation after | back after |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, p in kill["phases"].items():
            p50, p99 = _seconds(p["p50_s"]), _seconds(p["p99_s"])
            out, back = _seconds(p.get("unrouted_after_s")), _seconds(p.get("back_after_s"))
            lines.append(f"| {name} | {p['requests']} | {p['ok']} | {p['failed']} | "
                         f"{p['lost']} | {p50} | {p99} | {out} | {back} |")  # fmt: skip
        if kill["errors"]:
            lines += ["", "Errors: " + "; ".join(f"`{e}`" for e in kill["errors"])]
    return "\n".join(lines) + "\n"


def _uncached(rounds: list[dict]) -> float:
    """Uncached share summed over rounds (each round sends the same prompt tokens)."""
    return sum(1 - r["cached_share"] for r in rounds)


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.2f} s"


def plot(kills: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(kills), 1, figsize=(8, 3.2 * len(kills)), squeeze=False)
    for ax, kill in zip(axes[:, 0], kills, strict=True):
        ok = [o for o in kill["outcomes"] if o["status"] == "ok"]
        bad = [o for o in kill["outcomes"] if o["status"] != "ok"]
        ax.scatter([o["t"] for o in ok], [o["latency"] for o in ok], s=8, label="ok")
        if bad:
            ax.scatter([o["t"] for o in bad], [o["latency"] for o in bad], s=14, marker="x",
                       color="red", label=f"failed / lost ({len(bad)})")  # fmt: skip
        for i, e in enumerate(kill["events_s"]):
            for name, style in (("killed", "r--"), ("unrouted", "k:"), ("back", "g--")):
                if name in e:
                    ax.axvline(e[name], linestyle=style[1:], color=style[0],
                               label=name if i == 0 else None)  # fmt: skip
        ax.set_xlabel("request sent at (s)")
        ax.set_ylabel("latency (s)")
        ax.set_title(f"One of two replicas SIGKILLed {kill['kills']}x under load "
                     f"({kill['policy']} gateway)")  # fmt: skip
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--items", type=int, default=4, help="documents per user")
    parser.add_argument("--profile-tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="clients in the kill run")
    parser.add_argument("--seconds", type=float, default=45,
                        help="calm time before, between and after the kills")  # fmt: skip
    parser.add_argument("--kills", type=int, default=3, help="kills per gateway")
    parser.add_argument("--smoke", action="store_true", help="tiny model, a few requests")
    parser.add_argument("--kill-only", action="store_true", help="skip the affinity rounds")
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="an extra `smg launch` option for every gateway (repeat)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    if args.smoke:
        from prefillonly_sgl.models.tiny import build_tiny_model

        args.model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
        args.dtype, args.users, args.items, args.profile_tokens = "float32", 3, 2, 100
        args.rounds, args.seconds, args.clients, args.kills = 2, 12, 2, 1
    elif args.model is None:
        from prefillonly_sgl.models.default_model import default_model_path

        args.model = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    users = users_from_workload(tokenizer, args.users, args.items, args.profile_tokens)
    serve_args = ["--model-path", args.model, "--device", "cpu", "--dtype", args.dtype,
                  "--app", str(ROOT / "benchmarks" / "harness" / "rerank_app.py"),
                  "--rerank", "fan_rates_it"]  # fmt: skip
    if args.smoke:
        serve_args += ["--max-total-tokens", "4096", "--skip-server-warmup"]
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config["out"] = str(args.out)

    logs = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    port = free_port_run(3)
    extra_args = [a for arg in args.gateway_arg for a in arg.split()]
    replica_set = ReplicaSet(serve_args, replicas=2, port=port, log_dir=logs,
                             gateway_args=extra_args)  # fmt: skip
    extra = {}
    print(f"[setup] 2 replicas + 3 gateways (logs: {logs})")
    try:
        replica_set.start()
        for policy in POLICIES[1:]:
            extra[policy] = Gateway("127.0.0.1", free_port(), replica_set.replica_urls,
                                    policy, logs / f"gateway-{policy}.log",
                                    extra=extra_args, keys=replica_set.gateway.keys)  # fmt: skip
            extra[policy].start()
            extra[policy].wait_registered()
        gateways = {"cache_aware": replica_set.gateway, **extra}
        affinity_report = {} if args.kill_only else affinity(
            gateways, replica_set.replica_urls, users, args.rounds, 2)  # fmt: skip
        kills = [
            kill_run(replica_set, gateways[policy], users, args.clients, args.seconds, args.kills)
            for policy in ("cache_aware", "consistent_hashing")
        ]
    finally:
        for gateway in extra.values():
            gateway.stop()
        replica_set.stop()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"config": config, "affinity": affinity_report, "kills": kills}, indent=1))  # fmt: skip
    (args.out / "summary.md").write_text(markdown(config, affinity_report, kills))
    plot(kills, args.out / "kill_timeline.png")
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
