"""Prefill-only KV vs stock SGLang KV under one fixed KV-pool budget, in one run (issue 4).

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_only_kv.py                 # 8k 16k 32k
    PYTHONPATH=. .venv/bin/python benchmarks/prefill_only_kv.py --lengths 8192 16384
    PYTHONPATH=. .venv/bin/python benchmarks/prefill_only_kv.py --device cuda   # FlashInfer

Default model (SmolLM2-135M, the Engine's default dtype) on CPU. A scoring prompt is a
256-token query (the reusable prefix) followed by an item making it L tokens long (random
token ids). Both configurations get the same KV pool, --budget tokens (max_total_tokens),
and the same context length (max L + margin).

1. Longest prompt under the budget: each configuration scores prompts of growing length
   (--ladder, then --lengths) until one is refused or fails; the longest that scored.
2. Peak resident memory at each L: peak RSS of the engine's scheduler process (weights,
   KV pool, activations; sampled every 10 ms while the call runs) and of all its
   processes. Stock cannot score L > budget, so for this table it runs a second time with
   a pool sized to fit the prompt (max L + margin): the memory stock needs for L.
SGLang's default chunked prefill (4096 tokens on CPU) is left as it is: stock chunks long
prompts, prefill-only KV never chunks scoring prompts.

One engine at a time (SGLang's Engine.shutdown() kills every child of this process).
Writes a markdown report to stdout and to --out after each step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import threading
import time
from pathlib import Path

QUERY_TOKENS = 256
LABELS_TEXT = (" Yes", " No")
MARGIN = 512


class PeakRss:
    """Peak RSS (bytes) of a set of processes while the block runs, sampled every 10 ms;
    on a GPU also the device's peak used memory (all processes: one engine at a time)."""

    def __init__(self, scheduler, processes, gpu: bool = False) -> None:
        self.scheduler, self.processes, self.gpu = scheduler, processes, gpu
        self.peak_scheduler = self.peak_total = self.peak_gpu = 0

    def _sample(self) -> None:
        if self.gpu:
            import torch

            free, total = torch.cuda.mem_get_info()
            self.peak_gpu = max(self.peak_gpu, total - free)
        total = 0
        for p in self.processes:
            try:
                rss = p.memory_info().rss
            except Exception:
                continue
            total += rss
            if p.pid == self.scheduler.pid:
                self.peak_scheduler = max(self.peak_scheduler, rss)
        self.peak_total = max(self.peak_total, total)

    def __enter__(self):
        self._stop = threading.Event()

        def loop():
            while not self._stop.is_set():
                self._sample()
                time.sleep(0.01)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def _engine_processes(seen: set):
    import psutil

    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in seen]
    scheduler = next(p for p in new if "scheduler" in p.name())
    return scheduler, new + [psutil.Process()]


def start(model, name: str, pool: int, context: int, ours: bool, device: str = "cpu"):
    import psutil

    from prefillonly_sgl import Engine

    print(f"{name}: starting (pool {pool} tokens)", flush=True)
    seen = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = Engine(
        model,
        device=device,
        dtype="bfloat16" if device == "cuda" else "auto",  # FlashInfer: 16-bit only
        max_total_tokens=pool,
        context_length=context,
        prefill_only_kv=ours,
        schedule_policy="jct" if ours else "fcfs",
        hybrid_prefill=False,  # this benchmark measures the KV layout alone (issue 4)
        watchdog_timeout=3600,  # a 16k+ forward on a busy 2-core CPU takes > 300 s
    )
    engine.bench_scheduler, engine.bench_processes = _engine_processes(seen)
    return engine


def score_once(engine, rng: random.Random, length: int, labels) -> dict:
    """One score call of an L-token prompt: wall seconds, peak RSS, the scores."""
    from prefillonly_sgl.scoring.errors import InvalidRequestError

    vocab = engine.limits.vocab_size
    query = [rng.randrange(200, vocab - 200) for _ in range(QUERY_TOKENS)]
    item = [rng.randrange(200, vocab - 200) for _ in range(length - QUERY_TOKENS)]
    t0 = time.perf_counter()
    try:
        gpu = engine.device == "cuda"
        with PeakRss(engine.bench_scheduler, engine.bench_processes, gpu) as rss:
            scores = engine.score(query, [item], labels).scores
    except InvalidRequestError as e:
        return dict(ok=False, why=f"refused: {str(e)[:90]}")
    except Exception as e:  # a failure that is not a refusal is recorded as such
        return dict(ok=False, why=f"failed: {type(e).__name__}: {str(e)[:90]}")
    return dict(
        ok=True,
        seconds=time.perf_counter() - t0,
        rss_scheduler=rss.peak_scheduler,
        rss_total=rss.peak_total,
        gpu_used=rss.peak_gpu,
        scores=scores[0],
    )


def longest(engine, name, ladder, rng, labels, report) -> int:
    best = 0
    limit = engine.limits.scoring_prompt_tokens
    if limit < max(ladder):
        ladder = sorted(set(ladder) | {limit})  # the engine's own limit, then past it
    for length in ladder:
        r = score_once(engine, rng, length, labels)
        report["runs"].append(dict(config=name, L=length, **r))
        print(f"  {name} L={length}: {_brief(r)}", flush=True)
        if not r["ok"]:
            break
        best = length
    report["longest"][name] = dict(longest_scored=best, limit=engine.limits.scoring_prompt_tokens)
    return best


def _brief(r: dict) -> str:
    if not r["ok"]:
        return r["why"]
    return (
        f"{r['seconds']:.1f} s, peak RSS scheduler {r['rss_scheduler'] / 2**20:.0f} MiB, "
        f"all {r['rss_total'] / 2**20:.0f} MiB"
        + (f", peak GPU used {r['gpu_used'] / 2**20:.0f} MiB" if r.get("gpu_used") else "")
    )


def run(args) -> str:
    from prefillonly_sgl.models.default_model import default_model_path

    model = default_model_path()
    config = json.loads((Path(model) / "config.json").read_text())
    lengths = sorted(args.lengths)
    context = max(lengths) + MARGIN
    if context > config.get("max_position_embeddings", 0):
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    ladder = sorted(set(args.ladder) | set(lengths))
    report = dict(runs=[], longest={}, args=vars(args) | {"context": context})
    load_before = os.getloadavg()
    rng = random.Random(0)

    def save():
        text = render(report, config, load_before)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        return text

    for name, ours in (("stock", False), ("prefill-only KV", True)):
        engine = start(model, name, args.budget, context, ours, args.device)
        try:
            tok = engine.tokenizer
            labels = [tok.encode(w, add_special_tokens=False)[0] for w in LABELS_TEXT]
            score_once(engine, rng, 512, labels)  # warm-up
            longest(engine, name, ladder, rng, labels, report)
        finally:
            engine.shutdown()
        save()
    if not args.skip_stock_sized:
        name = "stock, pool sized to fit"
        engine = start(model, name, context, context, False, args.device)
        try:
            tok = engine.tokenizer
            labels = [tok.encode(w, add_special_tokens=False)[0] for w in LABELS_TEXT]
            score_once(engine, rng, 512, labels)
            for length in lengths:
                r = score_once(engine, rng, length, labels)
                report["runs"].append(dict(config=name, L=length, **r))
                print(f"  {name} L={length}: {_brief(r)}", flush=True)
                save()
        finally:
            engine.shutdown()
    return save()


def render(report, config, load_before) -> str:
    import torch

    args = report["args"]
    layers, kv_heads = config["num_hidden_layers"], config.get("num_key_value_heads")
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = 4 if config.get("torch_dtype", "float32") == "float32" else 2
    cell = 2 * layers * kv_heads * head_dim * dtype_bytes  # K and V, all layers, one token
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{_mem_gib():.0f} GiB, torch {torch.__version__} ({torch.get_num_threads()} threads). "
        f"Model SmolLM2-135M ({config.get('torch_dtype', 'float32')}, {layers} layers, "
        f"KV {cell / 1024:.1f} KiB per token). Budget: KV pool of {args['budget']} tokens "
        f"({args['budget'] * cell / 2**20:.0f} MiB) for both; context length {args['context']}; "
        f"query {QUERY_TOKENS} tokens + item; random token ids. Load average (1 min) at "
        f"start / now: {load_before[0]:.1f} / {os.getloadavg()[0]:.1f}.",
        "",
        "Longest prompt scored under the budget:",
        "",
        "| configuration | longest scored (tokens) | engine's own limit |",
        "|---|---|---|",
    ]
    for name, r in report["longest"].items():
        lines.append(f"| {name} | {r['longest_scored']} | {r['limit']} |")
    if "stock" in report["longest"] and "prefill-only KV" in report["longest"]:
        s = report["longest"]["stock"]["longest_scored"]
        o = report["longest"]["prefill-only KV"]["longest_scored"]
        if s:
            lines += ["", f"Ratio: {o / s:.1f}x (ours is bounded by the lengths tried)."]
    lines += [
        "",
        "Every run (peak RSS in MiB: the scheduler process, and all of the engine's "
        "processes plus this one):",
        "",
        "| configuration | pool (tokens) | L | result | seconds | peak RSS scheduler | "
        "peak RSS all | peak GPU used (device) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        pool = args["context"] if r["config"].startswith("stock, pool") else args["budget"]
        if r["ok"]:
            gpu = f"{r['gpu_used'] / 2**20:.0f}" if r.get("gpu_used") else "-"
            lines.append(
                f"| {r['config']} | {pool} | {r['L']} | ok | {r['seconds']:.1f} "
                f"| {r['rss_scheduler'] / 2**20:.0f} | {r['rss_total'] / 2**20:.0f} | {gpu} |"
            )
        else:
            lines.append(f"| {r['config']} | {pool} | {r['L']} | {r['why']} | | | | |")
    return "\n".join(lines)


def _mem_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--ladder", type=int, nargs="+", default=[1024])
    parser.add_argument("--budget", type=int, default=1024, help="KV pool tokens, both")
    parser.add_argument("--skip-stock-sized", action="store_true")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cuda: FlashInfer, bf16"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "prefill_only_kv.md"
    )
    print(run(parser.parse_args()))


if __name__ == "__main__":
    main()
