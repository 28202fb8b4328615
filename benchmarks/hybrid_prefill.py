"""Hybrid prefilling: peak memory and prefill time of long prompts, side by side (issues 12, 23).

    .venv/bin/python benchmarks/hybrid_prefill.py                         # 8k 16k 32k, ~45 min
    .venv/bin/python benchmarks/hybrid_prefill.py --lengths 8192 16384 --configs "ours, layers"
    .venv/bin/python benchmarks/hybrid_prefill.py --model qwen3 --lengths 16384 32768   # issue 62
    .venv/bin/python benchmarks/hybrid_prefill.py --model qwen3 --lengths 16384 --rounds 3
        --configs "ours, layers" "ours, token-wise" "ours, no hybrid"   # spread: 3 prompts each

Default model (SmolLM2-135M) in bfloat16 on CPU; one cold scoring prompt of L random tokens
(a 256-token query + the item) per run, configurations started one at a time. `--model
qwen3`: a random-weight Qwen3 (q / k norms) of the default model's sizes and tokenizer,
built once into the cache (issue 62: whole layers of another shape); or a model folder.

  stock                  SGLang as shipped, chunked prefill off (--chunked-prefill-size -1),
                         a KV pool that fits the prompt
  stock, chunked         SGLang as shipped with its own chunked prefill (4096 tokens on CPU)
  ours, no hybrid        prefill-only attention + KV + JCT, hybrid prefilling off (1024-token pool)
  ours, token-wise       + hybrid prefilling of the token-wise modules only (mode "token",
                         chunks of 2048), attention whole
  ours, layers           everything on: whole decoder layers in query chunks of 1024 (mode
                         "layer", the default; its CPU default chunk)

Memory: peak RSS of the engine's scheduler process while the call runs (its kernel
high-water mark, VmHWM, reset just before the call through /proc/<pid>/clear_refs: exact,
however brief the peak), minus its RSS just before: the activations (and for stock the KV
it writes). Every
engine runs with MALLOC_MMAP_THRESHOLD_=65536, so that freed tensors go back to the OS and
RSS follows live memory (glibc otherwise keeps freed chunks of its own choosing; this costs
some speed, equally for all). Time: the score call's wall seconds; `--timing` repeats the
"ours" configurations without that allocator setting, as deployed.

Also: the longest prompt each configuration fits under one memory budget (--budget-mib of
peak scheduler RSS), read off a straight line through its measured peaks (memory grows
linearly with the prompt here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from prefill_only_kv import PeakRss, _engine_processes

CONFIGS = ("stock", "stock, chunked", "ours, no hybrid", "ours, token-wise", "ours, layers")
HYBRID_MODES = {"ours, token-wise": "token", "ours, layers": "layer"}
QUERY_TOKENS = 256
MARGIN = 512
RESULTS = Path(__file__).resolve().parent / "results"


DEFAULT_DTYPE = "bfloat16"


def model_path(model: str) -> Path:
    """The model the benchmark runs: "default", "qwen3" (built once) or a folder."""
    from prefillonly_sgl.models.default_model import default_model_path

    if model == "default":
        return Path(default_model_path())
    if model == "qwen3":
        return qwen3_shaped(Path(default_model_path()))
    return Path(model)


def qwen3_shaped(default: Path) -> Path:
    """A random-weight Qwen3ForCausalLM with the default model's sizes (30 layers of 576,
    9 heads of 64, 3 KV heads, MLP 1536, vocabulary 49152, tied embeddings) and its
    tokenizer, in bfloat16: the same costs as SmolLM2 plus Qwen3's q / k norms, so its
    numbers sit beside the default model's. Random weights change no time or memory."""
    import shutil

    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from prefillonly_sgl.models.default_model import cache_root

    out = cache_root() / "bench-models" / "qwen3-smollm2-sizes"
    if (out / "config.json").exists():
        return out
    src = json.loads((default / "config.json").read_text())
    heads = src["num_attention_heads"]
    config = Qwen3Config(
        vocab_size=src["vocab_size"],
        hidden_size=src["hidden_size"],
        intermediate_size=src["intermediate_size"],
        num_hidden_layers=src["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=src["num_key_value_heads"],
        head_dim=src["hidden_size"] // heads,
        max_position_embeddings=40960,  # Qwen3's own: 32k prompts need no override
        rms_norm_eps=src.get("rms_norm_eps", 1e-5),
        tie_word_embeddings=src.get("tie_word_embeddings", True),
        bos_token_id=src.get("bos_token_id"),
        eos_token_id=src.get("eos_token_id"),
        pad_token_id=src.get("pad_token_id"),
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(default).save_pretrained(tmp)
    tmp.rename(out)
    return out


def engine_args(
    config: str,
    context: int,
    chunk: int | None = None,
    model: str = "default",
    dtype: str = DEFAULT_DTYPE,
):
    from prefillonly_sgl import STOCK_SGLANG

    common = dict(
        model=str(model_path(model)), dtype=dtype, context_length=context,
        watchdog_timeout=3600,
    )  # fmt: skip
    if config == "stock":
        # SGLang derives a negative mem_fraction_static when chunked prefill is off on CPU.
        return dict(
            **common,
            **STOCK_SGLANG,
            max_total_tokens=context,
            chunked_prefill_size=-1,
            mem_fraction_static=0.8,
        )
    if config == "stock, chunked":
        return dict(**common, **STOCK_SGLANG, max_total_tokens=context)
    if config in HYBRID_MODES:
        return dict(
            **common,
            max_total_tokens=1024,
            hybrid_prefill_mode=HYBRID_MODES[config],
            hybrid_prefill_chunk_size=chunk,
        )
    return dict(**common, max_total_tokens=1024, hybrid_prefill=False)


def reset_peak(pid: int) -> None:
    """Sets the process's resident high-water mark (VmHWM) to its current RSS."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def read_peak(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


class Run:
    """One configuration's engine, started with the benchmark's settings, and its scheduler
    process (whose memory is measured)."""

    def __init__(
        self,
        config: str,
        context: int,
        allocator: bool,
        chunk: int | None,
        model: str,
        dtype: str,
    ) -> None:
        import psutil

        from prefillonly_sgl import Engine

        self.config, self.allocator = config, allocator
        if allocator:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
        seen = {p.pid for p in psutil.Process().children(recursive=True)}
        try:
            self.engine = Engine(**engine_args(config, context, chunk, model, dtype))
        finally:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        self.scheduler, self.processes = _engine_processes(seen)
        self.vocab = self.engine.limits.vocab_size
        self.engine.score(self.tokens(random.Random(0), 512), [[7]], [5, 6])

    def tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(200, self.vocab - 200) for _ in range(n)]

    def measure(self, length: int, rng: random.Random) -> dict:
        """One cold prompt of `length` random tokens: its time and scheduler memory."""
        query = self.tokens(rng, QUERY_TOKENS)
        item = self.tokens(rng, length - QUERY_TOKENS)
        reset_peak(self.scheduler.pid)
        before = self.scheduler.memory_info().rss
        started = time.perf_counter()
        with PeakRss(self.scheduler, self.processes) as rss:
            scores = self.engine.score(query, [item], [5, 6]).scores[0]
        peak = max(read_peak(self.scheduler.pid), rss.peak_scheduler)
        row = dict(
            config=self.config,
            L=length,
            allocator=self.allocator,
            seconds=time.perf_counter() - started,
            rss_before_mib=before / 2**20,
            peak_mib=peak / 2**20,
            delta_mib=(peak - before) / 2**20,
            scores=scores,
        )
        print(
            f"  {self.config} L={length}: {row['seconds']:.1f} s, peak {row['peak_mib']:.0f} "
            f"MiB (+{row['delta_mib']:.0f} during the call)",
            flush=True,
        )
        return row


def run_config(
    config: str,
    lengths: list[int],
    context: int,
    allocator: bool,
    chunk: int | None = None,
    model: str = "default",
    dtype: str = DEFAULT_DTYPE,
) -> list[dict]:
    """`config`'s engine alone, one fresh prompt per length (`lengths` may repeat one)."""
    run = Run(config, context, allocator, chunk, model, dtype)
    rng = random.Random(0)
    try:
        return [run.measure(length, rng) for length in lengths]
    finally:
        run.engine.shutdown()


def pool_tokens(config: str, context: int) -> int:
    return 1024 if config.startswith("ours") else context


def longest_under(rows: list[dict], budget_mib: float, kv_mib: float, context: int) -> float:
    """The longest prompt whose peak fits the budget, with each configuration's pool at
    its smallest: stock keeps KV for every prompt token, so its pool must hold the prompt;
    ours keeps the 1024-token pool. Peak = fixed + pool + activations, where fixed = RSS
    before the call - the pool it had, and activations a straight line through the
    measured (L, during-call) points."""
    xs, ys = [r["L"] for r in rows], [r["delta_mib"] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    config = rows[0]["config"]
    fixed = (
        statistics.median(r["rss_before_mib"] for r in rows) - pool_tokens(config, context) * kv_mib
    )
    per_token = slope + (kv_mib if config.startswith("stock") else 0.0)
    kept = 0.0 if config.startswith("stock") else pool_tokens(config, context) * kv_mib
    return (budget_mib - fixed - kept - intercept) / per_token


def report(
    rows: list[dict],
    budget_mib: float,
    context: int,
    plot: Path | None = None,
    model: str = "default",
    dtype: str = DEFAULT_DTYPE,
) -> None:
    print(f"\n{'configuration':<18} {'L':>6} {'seconds':>8} {'peak MiB':>9} {'during call':>12}")
    for r in rows:
        tag = "" if r["allocator"] else " *"
        print(f"{r['config'] + tag:<18} {r['L']:>6} {r['seconds']:>8.1f} {r['peak_mib']:>9.0f} "
              f"{r['delta_mib']:>12.0f}")  # fmt: skip
    print("(* glibc's default allocator settings)")
    from prefillonly_sgl.memory.budget import kv_bytes_per_token
    from prefillonly_sgl.memory.measurement import model_config

    kv_mib = kv_bytes_per_token(model_config(model_path(model)), dtype) / 2**20
    print(f"Longest prompt under {budget_mib:.0f} MiB of scheduler RSS (smallest pool that "
          f"serves it; KV {kv_mib * 1024:.1f} KiB/token):")  # fmt: skip
    longest = {}
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config and r["allocator"]]
        if len(mine) >= 2:
            longest[config] = longest_under(mine, budget_mib, kv_mib, context)
            print(f"  {config:<18} {longest[config]:,.0f} tokens")
    if plot is not None and longest:
        from harness.plots import max_prompt_bars

        title = (f"Longest prompt under {budget_mib:,.0f} MiB of scheduler memory\n"
                 "SmolLM2-135M, bf16, 2-core CPU (ours: extrapolated past 32k)")  # fmt: skip
        print(f"plot: {max_prompt_bars(longest, title, plot)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--budget-mib", type=float, default=1536.0)
    parser.add_argument("--timing", action="store_true", help="also time ours as deployed")
    parser.add_argument(
        "--chunk-size", type=int, help="ours' hybrid chunk size (default: each mode's)"
    )
    parser.add_argument(
        "--model", default="default", help="default, qwen3 (the default's sizes) or a folder"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="fresh prompts per length and configuration"
    )
    parser.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        help="the engines' dtype (float32 on a CPU without bf16 GEMMs: AVX2-only hosts run "
        "torch's bf16 matmul ~100x slower than float32)",
    )
    parser.add_argument("--report", type=Path, help="print the report of a saved results file")
    parser.add_argument("--plot", type=Path, help="also draw the longest prompts (PNG)")
    args = parser.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        context = max(saved["args"]["lengths"]) + MARGIN
        model = saved["args"].get("model", "default")
        dtype = saved["args"].get("dtype", DEFAULT_DTYPE)  # the run's, not this call's
        report(saved["rows"], args.budget_mib, context, args.plot, model, dtype)
        return
    lengths = sorted(args.lengths)
    context = max(lengths) + MARGIN
    os.environ["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"  # past SmolLM2's 8192
    rows = []
    # Engines one at a time: with three up at once, the schedulers not scoring still took
    # ~80% of a core each on the 2-core machine (2026-11-27), which slows the one that is.
    repeated = [length for length in lengths for _ in range(args.rounds)]
    for config in args.configs:
        print(f"[hybrid] {config}", flush=True)
        rows += run_config(config, repeated, context, True, args.chunk_size, args.model, args.dtype)
    if args.timing:
        for config in [c for c in args.configs if c.startswith("ours")]:
            print(f"[hybrid] {config} (glibc's default allocator settings)", flush=True)
            rows += run_config(
                config, repeated, context, False, args.chunk_size, args.model, args.dtype
            )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"hybrid_prefill-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))

    report(rows, args.budget_mib, context, args.plot, args.model, args.dtype)
    print(f"[hybrid] results: {out}")


if __name__ == "__main__":
    main()
