"""Prefill-only attention vs stock SGLang attention, side by side in one run (issue 6).

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_attention.py            # 1k, 4k, 16k
    PYTHONPATH=. .venv/bin/python benchmarks/prefill_attention.py --lengths 1024 4096

For each prefix length L (random token ids, a fresh prefix per measurement):
- cold: score one 100-token item behind an uncached L-token prefix (an L + 100 prompt);
- hit: score another 100-token item behind the same, now cached, prefix.
Both engines run the default model (SmolLM2-135M) in bfloat16 on CPU: stock SGLang
(`Engine(prefill_only_attention=False)`, SGLang's torch_native backend) and ours.

The floor of a cold prefill is measured in the same run, in this process: the time of
the model's attention (fused causal SDPA, grouped-query heads, at L + 100 tokens) and of
its linear layers (bf16 matmuls of the model's shapes) times the number of layers. It
leaves out norms, rotary, activation, embeddings, the logits and SGLang's own overhead.
Writes a markdown table to stdout and to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import statistics
import time
from pathlib import Path

ITEM_TOKENS = 100
LABELS_TEXT = (" Yes", " No")


def model_shapes(config) -> dict:
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    hidden = config["hidden_size"]
    return dict(
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=kv_heads,
        head_dim=hidden // heads,
        hidden=hidden,
        intermediate=config["intermediate_size"],
    )


def floor_seconds(n_tokens: int, shapes: dict, reps: int = 2, cpu: bool = False) -> dict:
    """Measured time of one cold prefill's attention and linear layers at n_tokens (wall,
    or CPU seconds of all threads with cpu=True)."""
    import torch
    import torch.nn.functional as F

    s, dtype = shapes, torch.bfloat16
    q = torch.randn(1, s["heads"], n_tokens, s["head_dim"], dtype=dtype)
    k = torch.randn(1, s["kv_heads"], n_tokens, s["head_dim"], dtype=dtype)
    v = torch.randn_like(k)
    sdpa = _best(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        reps,
        cpu,
    )
    sdpa_flops = 2 * n_tokens * n_tokens * s["heads"] * s["head_dim"]  # causal: half of 4NND
    qkv_out = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    linear_shapes = [  # (in, out) of qkv, o, gate_up, down
        (s["hidden"], qkv_out),
        (s["heads"] * s["head_dim"], s["hidden"]),
        (s["hidden"], 2 * s["intermediate"]),
        (s["intermediate"], s["hidden"]),
    ]
    linear, linear_flops = 0.0, 0
    for fan_in, fan_out in linear_shapes:
        x = torch.randn(n_tokens, fan_in, dtype=dtype)
        w = torch.randn(fan_out, fan_in, dtype=dtype)
        linear += _best(lambda x=x, w=w: F.linear(x, w), reps, cpu)
        linear_flops += 2 * n_tokens * fan_in * fan_out
    layers = s["layers"]
    return dict(
        attention_s=layers * sdpa,
        linear_s=layers * linear,
        floor_s=layers * (sdpa + linear),
        sdpa_gflops=sdpa_flops / sdpa / 1e9,
        matmul_gflops=linear_flops / linear / 1e9,
        attention_flops=layers * sdpa_flops,
        linear_flops=layers * linear_flops,
    )


def _best(fn, reps: int, cpu: bool = False) -> float:
    """Least wall time (or CPU time of this process, all threads) over reps."""
    clock = time.process_time if cpu else time.perf_counter
    fn()
    times = []
    for _ in range(reps):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


class Prompts:
    """Random token ids (no special tokens), a fresh prefix for every cold request."""

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab_size

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(200, self.vocab - 200) for _ in range(n)]


def measure(engines: dict, length: int, prompts: Prompts, labels) -> dict:
    """{engine name: {"cold": [s], "hit": [s], "scores": [...]}} at one prefix length.
    The engines take turns on the same prompts, so load from other processes on a shared
    machine hits both alike."""
    reps_cold, reps_hit = (2, 3) if length <= 4096 else (1, 2)
    out = {name: dict(cold=[], hit=[], scores=[]) for name in engines}
    for _ in range(reps_cold):
        prefix = prompts.ids(length)
        item = prompts.ids(ITEM_TOKENS)
        for name, engine in engines.items():
            out[name]["cold"].append(_timed(engine, prefix, item, labels, out[name]["scores"]))
        for _ in range(reps_hit):
            item = prompts.ids(ITEM_TOKENS)
            for name, engine in engines.items():
                out[name]["hit"].append(_timed(engine, prefix, item, labels, out[name]["scores"]))
    for name in engines:
        print(f"  L={length} {name}: cold {out[name]['cold']} hit {out[name]['hit']}", flush=True)
    return out


def _timed(engine, prefix, item, labels, scores) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the engine's scheduler process) of one score call."""
    scheduler = engine.bench_scheduler
    cpu_start, start = _cpu(scheduler), time.perf_counter()
    result = engine.score(prefix, [item], labels)
    elapsed, cpu = time.perf_counter() - start, _cpu(scheduler) - cpu_start
    scores.append(result.scores[0])
    return elapsed, cpu


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _new_scheduler(seen: set):
    """The sglang::scheduler child process started since `seen` was taken."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        if child.pid not in seen and "scheduler" in child.name():
            return child
    raise RuntimeError("no SGLang scheduler process found")


def run(lengths, out: Path, chunked_prefill_size: int | None = None) -> str:
    import json

    import psutil

    from prefillonly_sgl import STOCK_SGLANG, Engine
    from prefillonly_sgl.models.default_model import default_model_path

    model = default_model_path()
    config = json.loads((Path(model) / "config.json").read_text())
    shapes = model_shapes(config)
    longest = max(lengths) + 2 * ITEM_TOKENS + 64
    context = max(longest, config.get("max_position_embeddings", 0))
    if longest > config.get("max_position_embeddings", 0):
        os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
    engine_args = dict(
        device="cpu",
        dtype="bfloat16",
        context_length=context,
        max_total_tokens=2 * longest + 1024,  # the cached prefix plus a full cold request
        chunked_prefill_size=chunked_prefill_size,  # None: SGLang's (4096 on a 24 GB host)
    )
    if chunked_prefill_size:
        # SGLang then reserves activation memory for the whole chunk out of "GPU" memory
        # (system memory on CPU) and its default static fraction goes negative; the pool is
        # capped by max_total_tokens anyway.
        engine_args["mem_fraction_static"] = 0.3
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        engines = {}
        for name, ours in (("stock", False), ("prefill-only", True)):
            print(f"{name}: starting engine", flush=True)
            seen = {p.pid for p in psutil.Process().children(recursive=True)}
            engines[name] = stack.enter_context(
                Engine(model, **({} if ours else STOCK_SGLANG), **engine_args)
            )
            engines[name].bench_scheduler = _new_scheduler(seen)
        tok = engines["stock"].tokenizer
        labels = [tok.encode(w, add_special_tokens=False)[0] for w in LABELS_TEXT]
        prompts = Prompts(len(tok), seed=1)
        for engine in engines.values():  # warm-up: a cold request and a hit
            warm = prompts.ids(512)
            engine.score(warm, [prompts.ids(16)], labels)
            engine.score(warm, [prompts.ids(16)], labels)
        measured, floors = {}, {}
        for length in lengths:
            measured[length] = measure(engines, length, prompts, labels)
            floors[length] = floor_seconds(length + ITEM_TOKENS, shapes)
            floors[length]["floor_cpu_s"] = floor_seconds(length + ITEM_TOKENS, shapes, cpu=True)[
                "floor_s"
            ]
            print(f"  L={length} floor {floors[length]}", flush=True)
            table = render(
                measured, floors, load_before, chunked_prefill_size
            )  # partial results survive a kill
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(table + "\n")
    return table


def render(measured: dict, floors: dict, load_before, chunked_prefill_size) -> str:
    import torch

    load_after = os.getloadavg()
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"model SmolLM2-135M bf16, item {ITEM_TOKENS} tokens, "
        f"chunked_prefill_size {chunked_prefill_size or 'SGLang default (4096 here)'}. "
        f"Load average (1 min) at start / now: {load_before[0]:.1f} / {load_after[0]:.1f}.",
        "",
        "Wall seconds (and in brackets CPU seconds of the engine's scheduler process, both "
        "threads; less sensitive to other load on the machine):",
        "",
        "| prefix L | stock cold | ours cold | floor | stock/floor | ours/floor "
        "| stock hit | ours hit | ours hit / stock cold | stock hit / stock cold "
        "| SDPA GFLOP/s | matmul GFLOP/s | max prob diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length in measured:
        stock, ours = measured[length]["stock"], measured[length]["prefill-only"]
        floor = floors[length]
        s_cold, o_cold = _least(stock["cold"]), _least(ours["cold"])
        s_hit, o_hit = _median(stock["hit"]), _median(ours["hit"])
        f_wall, f_cpu = floor["floor_s"], floor["floor_cpu_s"]
        diff = max(
            abs(a - b) for ra, rb in zip(stock["scores"], ours["scores"]) for a, b in zip(ra, rb)
        )
        lines.append(
            f"| {length} | {_pair(s_cold)} | {_pair(o_cold)} | {f_wall:.2f} [{f_cpu:.2f}] "
            f"| {s_cold[0] / f_wall:.2f} [{s_cold[1] / f_cpu:.2f}] "
            f"| {o_cold[0] / f_wall:.2f} [{o_cold[1] / f_cpu:.2f}] "
            f"| {_pair(s_hit, 3)} | {_pair(o_hit, 3)} "
            f"| {100 * o_hit[0] / s_cold[0]:.1f}% [{100 * o_hit[1] / s_cold[1]:.1f}%] "
            f"| {100 * s_hit[0] / s_cold[0]:.0f}% [{100 * s_hit[1] / s_cold[1]:.0f}%] "
            f"| {floor['sdpa_gflops']:.0f} | {floor['matmul_gflops']:.0f} | {diff:.1e} |"
        )
    lines += [
        "",
        "Both engines run at once and take turns on the same prompts (an idle engine sleeps). "
        "cold: least over runs; hit: median. floor = layers x (causal SDPA + the four linear "
        "layers) at L + 100 tokens, measured in this run (wall; CPU seconds in brackets). "
        "Attention / linear FLOPs per cold prefill: "
        + ", ".join(
            f"L={n}: {f['attention_flops']:.2e} / {f['linear_flops']:.2e}"
            for n, f in floors.items()
        )
        + ". max prob diff: stock vs ours on the same prompts (bf16).",
    ]
    return "\n".join(lines)


def _least(runs):
    return min(r[0] for r in runs), min(r[1] for r in runs)


def _median(runs):
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _pair(wall_cpu, digits: int = 2) -> str:
    return f"{wall_cpu[0]:.{digits}f} [{wall_cpu[1]:.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "prefill_attention.md"
    )
    parser.add_argument(
        "--chunked-prefill-size",
        type=int,
        help="SGLang's prefill chunk (default: SGLang's choice, 4096 on a 24 GB CPU host); "
        "a value above the longest prompt runs each cold prompt in one pass",
    )
    args = parser.parse_args()
    print(run(args.lengths, args.out, args.chunked_prefill_size))


if __name__ == "__main__":
    main()
