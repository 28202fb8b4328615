"""The engine itself on a card (issue 57): prefillonly's Engine against stock SGLang, side
by side on the same card, model and attention backend (FlashInfer).

    # on a lent card, through the engine kit (benchmarks/README.md, "The engine on a card"):
    bash scripts/gpu_kit/run_on_card.sh --engine
    # here, what the test runs (tiny shapes, CPU, float32):
    .venv/bin/python benchmarks/gpu_engine.py --tiny --device cpu --out /tmp/gpu_engine

A random-weight model of a published shape (Qwen3-0.6B: SGLang #9748's model; Llama-3.2-1B)
is written once with transformers (bf16 on a card), then each system starts as an Engine
in this process, one at a time: "stock" (every prefillonly feature off, SGLang's lpm
policy: its best for shared prefixes) and "ours" (the defaults; on CUDA, hybrid
prefilling's layers through FlashInfer's query chunks). Each system's engine runs in a
process of its own (SGLang ends the process whose engine's worker failed; the run goes on).
Parts, in this order, each written to results.json / results.md as it ends; no engine
starts after --deadline seconds, no part after --engine-seconds of its engine's process:

- correctness: label log-probabilities (over the whole vocabulary) of cold prompts, a
  shared prefix and its cache hit, and a prompt longer than a layer chunk, against a
  float32 transformers forward of the same weights on the same device;
- items: SGLang #9748's shape, requests of a 120-token query and 10 items of 180 tokens
  (300-token prompts), Poisson arrivals at rates set from stock's measured capacity;
  items/s at P99 <= 500 ms;
- recommendation: the paper's shape scaled to the card: users with 1-2k-token profiles,
  each request one user's profile and 8 items of 150 tokens, every user's requests spread
  over the run; requests/s at P99 <= --rec-p99 seconds;
- long: a cold 32k-token prompt (16k with the tiny sizes' limits scaled down): time and
  the scheduler's peak memory above what it held before the forward (prefillonly's memory
  probe, in engines of their own so the probe's synchronisation slows no load run), stock
  (unchunked) against ours (hybrid prefilling).

Token ids are random (seeded), below the tokenizer's size (the tiny models' tokenizer:
SGLang's score API refuses ids past it): the weights are random too, so text would mean
nothing; what is measured is the work, the cache and the scheduling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import engine_loadgen, stats  # noqa: E402
from harness.engine_loadgen import ScoreCall  # noqa: E402
from harness.loadgen import arrival_times  # noqa: E402

PARTS = ("correctness", "items", "recommendation", "long")
SYSTEMS = ("stock", "ours")
# Published shapes (config.json of Qwen/Qwen3-0.6B and meta-llama/Llama-3.2-1B).
SHAPES = {
    "qwen3-0.6b": dict(
        arch="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        arch="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "tiny": dict(
        arch="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}
FULL = dict(
    model="qwen3-0.6b",
    labels=16,
    correctness_prompts=(64, 700, 5000),
    items=dict(query=120, item=180, per_request=10, p99=0.5),
    rec=dict(users=32, profile=(1024, 2048), item=150, per_request=8),
    burst=24,
    rate_factors=(0.6, 1.0, 1.5, 2.2),
    run_seconds=4.0,
    least_requests=24,
    drain_seconds=4.0,
    long_tokens=32768,
    context=40960,
)
TINY = dict(
    model="tiny",
    labels=8,
    correctness_prompts=(16, 90, 1100),
    items=dict(query=24, item=36, per_request=4, p99=5.0),
    rec=dict(users=4, profile=(96, 160), item=24, per_request=3),
    burst=4,
    rate_factors=(0.5, 1.0),
    run_seconds=2.0,
    least_requests=4,
    drain_seconds=20.0,
    long_tokens=1200,
    context=2048,
)


# ---------------------------------------------------------------- the model


def build_model(shape_name: str, folder: Path, device: str, dtype: str, seed: int = 0) -> Path:
    """A random-weight model of the shape (transformers' own init), with the tiny models'
    tokenizer (prompts are token ids; only its special tokens are read)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from prefillonly_sgl.models.tiny import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    shape = dict(SHAPES[shape_name])
    arch = shape.pop("arch")
    tokenizer = build_tokenizer()
    config_class, model_class = (
        (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    )
    config = config_class(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


def tokenizer_size(folder: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder))


def reference_logprobs(folder: Path, prompts: list[list[int]], labels: list[int], device: str):
    """The labels' log-probabilities over the whole vocabulary at each prompt's last
    position: a float32 transformers forward of the same weights on the same device (no
    cache, one prompt at a time; prefillonly_sgl/reference.py)."""
    import torch

    from prefillonly_sgl.reference import TransformersReference

    reference = TransformersReference(folder, "float32", device)
    rows = [reference.next_token_logprobs(prompt)[labels].tolist() for prompt in prompts]
    del reference
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------- engines


def system_settings(system: str) -> dict:
    from prefillonly_sgl import STOCK_SGLANG

    if system == "stock":
        return {**STOCK_SGLANG, "schedule_policy": "lpm"}
    return {}


def start_engine(system: str, folder: Path, args, sizes: dict, memory_probe: Path | None = None):
    """An Engine of `system` on the model; the memory probe (an instrument) where given."""
    from prefillonly_sgl import Engine, runtime_config

    settings = dict(
        device=args.device,
        dtype=args.dtype,
        context_length=sizes["context"],
        **system_settings(system),
    )
    if args.device == "cuda":
        # Decode graphs: a prefill-only engine never decodes, and their capture needs
        # decode kernels the kit does not build; sampling (a scoring request samples
        # nothing) in torch rather than FlashInfer's sampling kernels, which it lacks too.
        settings["disable_cuda_graph"] = True
        settings["sampling_backend"] = "pytorch"
    else:
        settings["max_total_tokens"] = sizes["context"] * 2
    if memory_probe is None:
        return Engine(str(folder), **settings)
    config, sglang_args = runtime_config.from_engine_args(
        str(folder),
        memory_budget=None,
        max_prompt_tokens=None,
        max_total_tokens=settings.pop("max_total_tokens", None),
        **settings,
    )
    return Engine.from_config(config.with_memory_probe(memory_probe), **sglang_args)


# ---------------------------------------------------------------- workloads


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


def items_calls(sizes, vocab, labels, n, seed) -> list[ScoreCall]:
    """SGLang #9748's requests: a fresh query and its items (no prefix shared)."""
    rng, shape = random.Random(seed), sizes["items"]
    return [
        ScoreCall(
            random_ids(rng, shape["query"], vocab),
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def recommendation_calls(sizes, vocab, labels, n, seed) -> list[ScoreCall]:
    """n requests of the same users (profiles seeded once per run of the script), each a
    random user's profile and fresh items: a user's requests spread over the run, as users
    come back (the first request of a user in an engine is its profile's miss)."""
    shape = sizes["rec"]
    profiles_rng = random.Random(7)
    profiles = [
        random_ids(profiles_rng, profiles_rng.randint(*shape["profile"]), vocab)
        for _ in range(shape["users"])
    ]
    rng = random.Random(seed)
    return [
        ScoreCall(
            profiles[rng.randrange(len(profiles))],
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def burst_capacity(engine, calls: list[ScoreCall], deadline: float) -> float:
    """Requests per second of a burst (all sent at once): the engine's capacity."""
    outcomes, wall = engine_loadgen.run(engine, calls, [0.0] * len(calls), deadline)
    return stats.summarize(outcomes, wall)["throughput"]


def rate_runs(engine, make_calls, rates, sizes, log) -> list[dict]:
    rows = []
    for k, rate in enumerate(rates):
        n = stats.run_requests(rate, sizes["run_seconds"], sizes["least_requests"], 10**6)
        calls = make_calls(n, 1000 + k)
        times = arrival_times(len(calls), rate, seed=k)
        outcomes, wall = engine_loadgen.run(
            engine, calls, times, times[-1] + sizes["drain_seconds"]
        )
        row = {"rate": rate, **stats.summarize(outcomes, wall)}
        rows.append(row)
        log(
            f"    rate {rate:.2f}/s: {row['completed']}/{row['requests']} done, p50 "
            f"{row['p50']:.3f} s, p99 {row['p99']:.3f} s, hits {row['cache_hit_share']:.0%}"
        )
    return rows


# ---------------------------------------------------------------- parts


def part_correctness(engine, system, ctx, results, log) -> None:
    rows = results.setdefault("correctness", {}).setdefault("rows", [])
    for name, query, item in ctx["correctness_cases"]:
        result = engine.score(query, [item], ctx["labels"], apply_softmax=False)
        got = [math.log(max(p, 1e-300)) for p in result.scores[0]]
        ref = ctx["reference"][name]
        rows.append(
            {
                "system": system,
                "case": name,
                "tokens": len(query) + len(item),
                "cached_tokens": result.cached_tokens,
                "max_abs_logprob_diff": max(abs(a - b) for a, b in zip(got, ref, strict=True)),
            }
        )
        log(f"    {name}: max |logprob diff| {rows[-1]['max_abs_logprob_diff']:.2e}")


def part_load(engine, system, ctx, results, log, workload: str) -> None:
    """items / recommendation: a burst on stock sets the rates (the same for both)."""
    sizes = ctx["sizes"]
    entry = results.setdefault(workload, {})
    if workload == "items":

        def make(n, seed):
            return items_calls(sizes, ctx["vocab"], ctx["labels"], n, seed)

        bound = sizes["items"]["p99"]
    else:

        def make(n, seed):
            return recommendation_calls(sizes, ctx["vocab"], ctx["labels"], n, seed)

        bound = ctx["rec_p99"]
    entry["p99_bound_s"] = bound
    if "rates" not in entry:
        capacity = burst_capacity(engine, make(sizes["burst"], 1), deadline=120.0)
        entry["capacity_measured_on"] = system
        entry["burst_capacity_per_s"] = capacity
        entry["rates"] = [round(capacity * f, 3) for f in sizes["rate_factors"]]
        log(f"    {system} burst: {capacity:.2f} requests/s")
    rows = rate_runs(engine, make, entry["rates"], sizes, log)
    rate, exact = stats.crossing_rate(rows, bound)
    entry.setdefault("systems", {})[system] = {
        "rows": rows,
        "rate_at_p99": rate,
        "rate_exact": exact,
        "sustained_rate": stats.sustained_rate(rows, bound),
    }


def part_long_system(folder, args, ctx, results, log, system: str) -> None:
    """One system's cold long prompt, in an engine of its own with the memory probe."""
    rng = random.Random(3)
    prompt = random_ids(rng, ctx["sizes"]["long_tokens"], ctx["vocab"])
    entry = results.setdefault("long", {"tokens": len(prompt), "systems": {}})
    probe = args.work / f"memory-{system}.jsonl"
    probe.unlink(missing_ok=True)
    with start_engine(system, folder, args, ctx["sizes"], memory_probe=probe) as engine:
        engine.score(prompt[:64], [prompt[64:128]], ctx["labels"])  # warm (kernels)
        probe.unlink(missing_ok=True)
        started = time.perf_counter()
        half = len(prompt) // 2
        engine.score(prompt[:half], [prompt[half:]], ctx["labels"])
        seconds = time.perf_counter() - started
    forwards = [json.loads(line) for line in probe.read_text().splitlines()]
    peak = max(f["peak"] - f["resident_before"] for f in forwards)
    entry["systems"][system] = {
        "seconds": seconds,
        "forwards": len(forwards),
        "peak_above_resident_mib": peak / 2**20,
    }
    log(f"long: {seconds:.2f} s, {len(forwards)} forwards, peak +{peak / 2**20:.0f} MiB")


# ---------------------------------------------------------------- results


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "results.md").write_text(markdown(results))


def _load_table(entry: dict, unit: float, what: str) -> list[str]:
    lines = [
        f"p99 bound {entry.get('p99_bound_s')} s; rates from {entry.get('capacity_measured_on')}'s "
        f"burst capacity ({entry.get('burst_capacity_per_s', 0):.2f} requests/s)",
        "",
        "| system | rate /s | done | p50 s | p99 s | cache hits |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, data in entry.get("systems", {}).items():
        for row in data["rows"]:
            lines.append(
                f"| {system} | {row['rate']:.2f} | {row['completed']}/{row['requests']} | "
                f"{row['p50']:.3f} | {row['p99']:.3f} | {row['cache_hit_share']:.0%} |"
            )
    lines.append("")
    rates = {s: d["rate_at_p99"] for s, d in entry.get("systems", {}).items()}
    for system, data in entry.get("systems", {}).items():
        tag = "" if data["rate_exact"] else " (a bound)"
        lines.append(f"- {system}: {data['rate_at_p99'] * unit:.1f} {what} at the bound{tag}")
    if rates.get("stock"):
        lines.append(f"- ours / stock: {rates.get('ours', 0) / rates['stock']:.2f}x")
    return lines + [""]


def markdown(results: dict) -> str:
    lines = [f"# The engine on {results['environment'].get('device_name', 'CPU')}", ""]
    lines += ["```", json.dumps(results["environment"], indent=1), "```", ""]
    lines.append(f"model {results.get('model')}; command `{results.get('command')}`")
    lines.append("")
    if "correctness" in results:
        lines += ["## Correctness: max |label logprob diff| against float32 transformers", ""]
        lines += [
            "| system | case | tokens | cached | max diff |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for row in results["correctness"].get("rows", []):
            lines.append(
                f"| {row['system']} | {row['case']} | {row['tokens']} | {row['cached_tokens']} | "
                f"{row['max_abs_logprob_diff']:.2e} |"
            )
        lines.append("")
    if "items" in results:
        per = results["sizes"]["items"]["per_request"]
        lines += ["## Items (SGLang #9748's shape)", ""]
        lines += _load_table(results["items"], per, "items/s")
    if "recommendation" in results:
        lines += ["## Recommendation (users behind long profiles)", ""]
        lines += _load_table(results["recommendation"], 1, "requests/s")
    if "long" in results:
        lines += [f"## A cold {results['long']['tokens']}-token prompt", ""]
        lines += [
            "| system | s | forwards | peak MiB above resident |",
            "| --- | ---: | ---: | ---: |",
        ]
        for system, row in results["long"]["systems"].items():
            lines.append(
                f"| {system} | {row['seconds']:.2f} | {row['forwards']} | "
                f"{row['peak_above_resident_mib']:.0f} |"
            )
        lines.append("")
    for part, error in results.get("errors", {}).items():
        lines += [f"## {part}: failed", "", "```", error[-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def environment(device: str) -> dict:
    import platform

    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
    }
    try:
        import sglang

        env["sglang"] = sglang.__version__
    except ImportError:
        pass
    if device == "cuda":
        env["device_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            import flashinfer

            env["flashinfer"] = flashinfer.__version__
        except ImportError:
            pass
    return env


# ---------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_engine")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU test)")
    parser.add_argument("--model", choices=sorted(SHAPES), default=None)
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help="stock,ours (stock first: it sets the rates)"
    )
    parser.add_argument(
        "--deadline", type=float, default=380.0, help="no engine starts after (s from the start)"
    )
    parser.add_argument(
        "--engine-seconds",
        type=float,
        default=200.0,
        help="no part starts after this long from its engine's process start",
    )
    parser.add_argument("--rec-p99", type=float, default=1.0, help="recommendation's bound, s")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_engine_work"))
    # A child process's own arguments (main() runs one per system and part group).
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--ends-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {', '.join(PARTS)}")
    args.parts = parts
    args.systems = [x for x in args.systems.split(",") if x]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    args.sizes = dict(TINY if args.tiny else FULL)
    args.model = args.model or args.sizes["model"]
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args


def context(args, folder: Path, results: dict) -> dict:
    """What the parts share, the same in every process (seeded)."""
    sizes = args.sizes
    # SGLang's score API refuses token ids at or past the tokenizer's size (not the LM
    # head's): prompts are drawn below both.
    vocab = min(SHAPES[args.model]["vocab_size"], tokenizer_size(folder))
    rng = random.Random(11)
    labels = sorted(rng.sample(range(1, vocab), sizes["labels"]))
    shared = random_ids(rng, sizes["correctness_prompts"][1], vocab)
    short, long = sizes["correctness_prompts"][0], sizes["correctness_prompts"][2]
    cases = [
        ("cold", random_ids(rng, short, vocab), random_ids(rng, 8, vocab)),
        ("prefix", shared, random_ids(rng, 16, vocab)),
        ("prefix hit", shared, random_ids(rng, 16, vocab)),
        ("longer than a chunk", random_ids(rng, long, vocab), random_ids(rng, 8, vocab)),
    ]
    return {
        "sizes": sizes,
        "vocab": vocab,
        "labels": labels,
        "rec_p99": 5.0 if args.tiny else args.rec_p99,
        "correctness_cases": cases,
        "reference": results.get("correctness", {}).get("reference", {}),
    }


def run_system(args) -> int:
    """A child: one system's engine for args.parts, results read from and written back
    to args.out (the parent runs children one at a time)."""
    started = time.perf_counter()
    results = json.loads((args.out / "results.json").read_text())
    folder = args.work / args.model
    ctx = context(args, folder, results)
    system = args.system

    def log(message: str) -> None:
        print(f"[{system} {time.perf_counter() - started:6.1f} s] {message}", flush=True)

    def save() -> None:
        write(results, args.out)

    if args.parts == ["long"]:
        try:
            part_long_system(folder, args, ctx, results, log, system)
        except Exception:
            results["errors"][f"{system} long"] = traceback.format_exc()
            log(results["errors"][f"{system} long"])
        save()
        return 0
    t0 = time.perf_counter()
    engine = start_engine(system, folder, args, args.sizes)
    results["part_seconds"][f"{system} start"] = time.perf_counter() - t0
    log(f"engine started in {time.perf_counter() - t0:.1f} s")
    with engine:
        for part in args.parts:
            if time.time() > args.ends_at:
                results["errors"][f"{system} {part}"] = "not started: past the deadline"
                break
            log(part)
            t0 = time.perf_counter()
            try:
                if part == "correctness":
                    part_correctness(engine, system, ctx, results, log)
                else:
                    part_load(engine, system, ctx, results, log, part)
            except Exception:
                results["errors"][f"{system} {part}"] = traceback.format_exc()
                log(results["errors"][f"{system} {part}"])
            results["part_seconds"][f"{system} {part}"] = time.perf_counter() - t0
            save()
    save()
    return 0


def run_in_group(command: list[str], limit: float) -> tuple[int | None, str]:
    """Runs a child in a process group of its own: one that runs past `limit` seconds (a
    hung engine) is killed with its engine's workers, which hold the card, and so is one
    the user interrupts. Returns its exit code (None: killed) and what to report."""
    import subprocess

    child = subprocess.Popen(command, start_new_session=True)
    try:
        code = child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return None, f"the process ran past {limit:.0f} s and was killed"
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    return code, f"the process ended with code {code} (the log has its error)"


def run_child(args, argv, system: str, parts: list[str], results: dict, log) -> dict:
    """Runs one system's parts in a child process (SGLang ends the process that started
    an engine whose worker failed: the run goes on without it) and reads back results."""
    ends_at = time.time() + args.engine_seconds
    command = [sys.executable, __file__, *argv, "--system", system, "--parts", ",".join(parts)]
    command += ["--ends-at", str(ends_at)]
    write(results, args.out)
    code, ended = run_in_group(command, args.engine_seconds + 240)
    merged = json.loads((args.out / "results.json").read_text())
    if code != 0:
        key = f"{system} {'+'.join(parts)}"
        merged["errors"][key] = ended
        log(merged["errors"][key])
    return merged


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.device == "cuda":
        # Hybrid prefilling's layers attend through FlashInfer's query chunks: the path
        # this run exists to measure (environment.py: opt-in until it has run on a card).
        os.environ.setdefault("PREFILLONLY_CUDA_QUERY_CHUNKS", "1")
    if args.system:
        return run_system(args)
    args.started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - args.started:6.1f} s] {message}", flush=True)

    results = {
        "environment": environment(args.device),
        "command": " ".join(["benchmarks/gpu_engine.py", *argv]),
        "model": args.model,
        "sizes": args.sizes,
        "errors": {},
        "part_seconds": {},
    }
    args.work.mkdir(parents=True, exist_ok=True)
    folder = build_model(args.model, args.work / args.model, args.device, args.dtype)
    log(f"model {args.model} at {folder}")
    ctx = context(args, folder, results)
    if "correctness" in args.parts:
        prompts = [q + i for _, q, i in ctx["correctness_cases"]]
        logprobs = reference_logprobs(folder, prompts, ctx["labels"], args.device)
        names = [c[0] for c in ctx["correctness_cases"]]
        results["correctness"] = {"reference": dict(zip(names, logprobs, strict=True))}
    engine_parts = [p for p in args.parts if p in ("correctness", "items", "recommendation")]
    systems = [s for s in SYSTEMS if s in args.systems]
    groups = [(s, engine_parts) for s in systems if engine_parts]
    groups += [(s, ["long"]) for s in systems if "long" in args.parts]
    for system, parts in groups:
        if time.perf_counter() - args.started > args.deadline:
            results["errors"][f"{system} {'+'.join(parts)}"] = "not started: past the deadline"
            continue
        log(f"{system}: {', '.join(parts)}")
        results = run_child(args, argv, system, parts, results, log)
    write(results, args.out)
    log(f"done; results in {args.out}")
    print(markdown(results))
    return 1 if any(not e.startswith("not started") for e in results["errors"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
