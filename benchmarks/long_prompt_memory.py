"""Where a cold long prompt's peak memory goes (issue 83, item 6): ours' one forward with
whole decoder layers in query chunks (hybrid prefilling, mode "layer") against stock
SGLang's chunked prefill, on CPU, with every torch allocation of the forward traced.

    .venv/bin/python benchmarks/long_prompt_memory.py                  # ~15 min on 2 cores
    .venv/bin/python benchmarks/long_prompt_memory.py --tokens 8192 --systems ours stock
    .venv/bin/python benchmarks/long_prompt_memory.py --layers 2 --tokens 2048   # a quick look

The model: a random-weight Qwen3ForCausalLM of Qwen3-0.6B's shape (hidden 1024, 28 layers,
16 q heads, 8 KV heads, head dim 128, intermediate 3072, its vocabulary; transformers'
init, weights change no memory), float32, the tiny models' tokenizer (prompts are token
ids), built once under --work. The prompt: L random token ids scored as the card's long
part scores it (benchmarks/card_engine/parts.py, run_long): a warm-up score of its first
128 tokens, then `score(prompt[:L/2], [prompt[L/2:]], labels)` (so the reusable prefix is
half the prompt; its first 64 tokens are a cache hit of the warm-up's query).

Systems, one engine at a time:

  ours    the defaults: one forward, whole layers in query chunks (1024 rows on CPU),
          prefill-only KV (the second half's KV dropped), a pool of L + 1,024 tokens
  stock   prefillonly_sgl.STOCK_SGLANG, chunked prefill of L/4 tokens (four forwards, as
          the card's 8,192-token chunks of its 32k prompt), the same pool

Two measures per forward:

- the memory probe (sglang_runtime/memory_probe/: the scheduler's resident set, its
  high-water mark reset before the forward) with MALLOC_MMAP_THRESHOLD_=65536, so that
  freed tensors go back to the OS and the resident set follows live memory;
- every torch allocation of the forward (torch.profiler with profile_memory and Python
  stacks, in the scheduler: this file is imported there through a generated
  sitecustomize.py when LONG_PROMPT_MEMORY_TRACE is set): the peak of live bytes
  allocated during the forward, and the tensors alive at that peak, each with the code that
  allocated it. The profiler's own buffers swell the resident set, so each system scores
  two cold prompts of the same shape in one engine, the first untraced (the probe's
  figure, the seconds), the second traced.

The report (markdown, --out) lists the tensors alive at each system's peak with their
size in values per token of the prompt (whole-prompt tensors) and scaled to the card's
case (32,768 tokens in bf16: x 4 x 1/2 for whole-prompt tensors; a 2,048-row chunk in
bf16 for ours' chunk-sized ones: x 2 x 1/2 from CPU's 1,024).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from card_engine.systems import SHAPES

TRACE_ENV = "LONG_PROMPT_MEMORY_TRACE"  # the trace's file, read in the scheduler; its forwards
# are traced while "<file>.arm" exists
HERE = Path(__file__).resolve().parent
# Qwen3-0.6B's published shape, as the card script builds it (its "arch" is ours, not a
# config field)
SHAPE = {k: v for k, v in SHAPES["qwen3-0.6b"].items() if k != "arch"}
CARD_TOKENS, CARD_CHUNK, CARD_BYTES = 32768, 2048, 2  # the H200 run: 32k prompt, bf16


# -- in the scheduler: the forward's allocations ---------------------------------------


def install_trace() -> None:
    """Called by the generated sitecustomize.py in each engine process: an AROUND hook on
    ModelRunner.forward (SGLang applies it with the plugin's hooks)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner.forward",
        _traced_forward,
        HookType.AROUND,
    )


def _traced_forward(original, self, forward_batch, *args, **kwargs):
    path = os.environ[TRACE_ENV]
    tokens = int(forward_batch.input_ids.shape[0])
    if not forward_batch.forward_mode.is_extend() or not os.path.exists(f"{path}.arm"):
        return original(self, forward_batch, *args, **kwargs)
    from torch.profiler import ProfilerActivity, profile

    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as p:
        result = original(self, forward_batch, *args, **kwargs)
    seconds = time.perf_counter() - started
    record = analyse(p.profiler.kineto_results.experimental_event_tree())
    record.update(tokens=tokens, seconds=seconds, requests=int(forward_batch.batch_size))
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
    return result


def _frame(name: str) -> str | None:
    """'path/to/file.py(123): function' -> 'package/file.py:function' for our and SGLang's
    code; None for other frames."""
    for root in ("prefillonly_sgl/", "sglang/", "benchmarks/"):
        if root in name:
            where, _, function = name.rpartition(": ")
            file = where[where.index(root) :].split("(")[0]
            return f"{file}:{function}"
    return None


def analyse(roots) -> dict:
    """The allocation events of a profiled call (an event tree): the peak of live bytes
    allocated during the call, and what is alive at that peak (grouped by size, the aten op
    and the innermost frames of our and SGLang's code)."""
    from torch._C._profiler import _EventType

    events = []  # (time, ptr, bytes, where)
    stack = [(root, ()) for root in roots]
    while stack:
        event, frames = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.ptr, fields.alloc_size, frames))
            continue
        if event.tag == _EventType.PyCall:
            frame = _frame(event.name)
            if frame is not None:
                frames = (*frames, frame)
        elif event.tag == _EventType.TorchOp and not any(f.startswith("aten::") for f in frames):
            frames = (*frames, event.name)  # the outermost aten op
        stack.extend((child, frames) for child in event.children)
    events.sort(key=lambda e: e[0])
    live: dict[int, tuple[int, tuple]] = {}
    total = peak = 0
    at_peak: dict = {}
    freed_before = 0  # frees of tensors allocated before the call
    for _, ptr, size, frames in events:
        total += size
        if size > 0:
            live[ptr] = (size, frames)
        elif ptr in live:
            del live[ptr]
        else:
            freed_before -= size
        if total > peak:
            peak, at_peak = total, dict(live)
    groups: dict[tuple, dict] = {}
    for size, frames in at_peak.values():
        op = next((f for f in frames if f.startswith("aten::")), "?")
        code = [f for f in frames if not f.startswith("aten::")]
        key = (size, op, tuple(code[-4:]))
        group = groups.setdefault(key, {"bytes": size, "count": 0, "op": op, "code": code[-4:]})
        group["count"] += 1
    live_at_peak = sorted(groups.values(), key=lambda g: -g["bytes"] * g["count"])
    return {
        "torch_peak_bytes": peak,
        "freed_before_call_bytes": freed_before,
        "allocations": sum(1 for e in events if e[2] > 0),
        "live_at_peak": live_at_peak,
    }


# -- the benchmark -----------------------------------------------------------------------


def build_model(folder: Path, layers: int) -> Path:
    """The random-weight Qwen3 of Qwen3-0.6B's shape (`layers` of them), float32, once."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from prefillonly_sgl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        **dict(SHAPE, num_hidden_layers=layers),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def engine_settings(system: str, tokens: int, chunk: int | None) -> dict:
    from prefillonly_sgl import STOCK_SGLANG

    common = dict(
        device="cpu",
        dtype="float32",
        context_length=tokens + 512,
        max_total_tokens=tokens + 1024,
        watchdog_timeout=3600,
    )
    if system == "stock":
        return dict(common, **STOCK_SGLANG, chunked_prefill_size=tokens // 4)
    return dict(common, **({} if chunk is None else {"hybrid_prefill_chunk_size": chunk}))


def run_system(system: str, folder: Path, args, work: Path) -> dict:
    from prefillonly_sgl import Engine
    from prefillonly_sgl.config import runtime_config

    probe, trace = work / f"probe-{system}.jsonl", work / f"trace-{system}.jsonl"
    probe.unlink(missing_ok=True)
    trace.unlink(missing_ok=True)
    settings = engine_settings(system, args.tokens, args.chunk)
    config, sglang_args = runtime_config.from_engine_args(
        str(folder), memory_budget=None, max_prompt_tokens=None, **settings
    )
    site = work / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"if os.environ.get({TRACE_ENV!r}):\n"
        f"    sys.path.insert(0, {str(HERE)!r})\n"
        "    import long_prompt_memory\n"
        "    long_prompt_memory.install_trace()\n"
    )
    saved = {k: os.environ.get(k) for k in (TRACE_ENV, "PYTHONPATH", "MALLOC_MMAP_THRESHOLD_")}
    os.environ[TRACE_ENV] = str(trace)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), saved["PYTHONPATH"]) if p)
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        engine = Engine.from_config(config.with_memory_probe(probe), **sglang_args)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    rng = random.Random(3)
    # SGLang's score API refuses ids at or past the tokenizer's size (the card's rule)
    vocab = min(SHAPE["vocab_size"], len(engine.tokenizer))
    labels = sorted(rng.sample(range(10, vocab), 16))
    arm = Path(f"{trace}.arm")
    calls = {}
    with engine:
        # the same prompt's shape twice, each cold: first untraced (the probe's resident
        # peak, the seconds), then traced (the profiler's own buffers swell the resident
        # set: its allocations only)
        for name in ("plain", "traced"):
            prompt = [rng.randrange(10, vocab) for _ in range(args.tokens)]
            engine.score(prompt[:64], [prompt[64:128]], labels)  # warm-up, as the card's
            probe.unlink(missing_ok=True)
            if name == "traced":
                arm.touch()
            started = time.perf_counter()
            half = len(prompt) // 2
            scores = engine.score(prompt[:half], [prompt[half:]], labels).scores[0]
            seconds = time.perf_counter() - started
            arm.unlink(missing_ok=True)
            calls[name] = dict(
                seconds=seconds,
                scores=scores,
                forwards=[_forward(json.loads(line)) for line in probe.read_text().splitlines()],
            )
    return {
        "system": system,
        "settings": {k: v for k, v in settings.items() if k not in ("device",)},
        **calls["plain"],
        "traced_call": calls["traced"],
        "traces": [json.loads(line) for line in trace.read_text().splitlines()],
    }


def _forward(record: dict) -> dict:
    return {
        "tokens": record["tokens"],
        "rss_peak_above_before_mib": (record["peak"] - record["resident_before"]) / 2**20,
        "rss_before_mib": record["resident_before"] / 2**20,
    }


def describe(
    size: int, tokens: int, chunk: int, card_tokens: int, card_chunk: int, code=()
) -> tuple[str, float]:
    """(what a float32 tensor of `size` bytes is, its size in MiB in the card's case): a
    whole-forward tensor (a multiple of 16 values per token of the forward's `tokens`,
    or a layer's kept keys: the dropped share of them) scales to the card's forward of
    `card_tokens` in bf16, a chunk-sized one (of ours' `chunk` rows) to the card's
    `card_chunk` rows in bf16."""
    mib = 2**20
    if any("layer_keys.py" in frame for frame in code):
        return (
            f"{size / (tokens * 4):.0f} per token of the {tokens} (the dropped rows' kept keys)",
            size * card_tokens / tokens * CARD_BYTES / 4 / mib,
        )
    if size % (tokens * 4 * 16) == 0:
        return (
            f"{size // (tokens * 4)} x {tokens} tokens",
            size * card_tokens / tokens * CARD_BYTES / 4 / mib,
        )
    if size % (chunk * 4 * 16) == 0:
        return (
            f"{size // (chunk * 4)} x {chunk} chunk rows",
            size * card_chunk / chunk * CARD_BYTES / 4 / mib,
        )
    return "other", size * CARD_BYTES / 4 / mib


def report(results: list[dict], args) -> str:
    mib = 2**20
    lines = [
        "# Where a cold long prompt's peak memory goes (CPU, float32)",
        "",
        f"Command: `.venv/bin/python benchmarks/long_prompt_memory.py {' '.join(args.argv)}`",
        "",
        f"Qwen3-0.6B's shape ({args.layers} layers), random weights, float32; a cold prompt of "
        f"{args.tokens} tokens scored as score(prompt[:{args.tokens // 2}], "
        f"[prompt[{args.tokens // 2}:]], 16 labels), after a warm-up of its first 128.",
        "",
        "| system | seconds | forwards (tokens) | probe: RSS peak above before, MiB (max) "
        "| torch: peak allocated during the forward, MiB (max; a second prompt, traced) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        rss = max(f["rss_peak_above_before_mib"] for f in r["forwards"])
        torch_peak = max(t["torch_peak_bytes"] for t in r["traces"]) / mib
        sizes = ", ".join(str(f["tokens"]) for f in r["forwards"])
        lines.append(
            f"| {r['system']} | {r['seconds']:.1f} | {len(r['forwards'])} ({sizes}) | "
            f"{rss:.0f} | {torch_peak:.0f} |"
        )
    for r in results:
        peak = max(r["traces"], key=lambda t: t["torch_peak_bytes"])
        tokens = peak["tokens"]
        if r["system"] == "ours":  # one forward of L; its layer chunk (CPU 1024), the card's 2048
            card_tokens, chunk, card_chunk = CARD_TOKENS, args.chunk or 1024, CARD_CHUNK
        else:  # stock's forward is its chunk: L / 4, the card's 8,192
            card_tokens = card_chunk = CARD_TOKENS // 4
            chunk = tokens
        lines += [
            "",
            f"## {r['system']}: alive at the peak of its largest forward ({tokens} tokens, "
            f"{peak['torch_peak_bytes'] / mib:.1f} MiB allocated during it)",
            "",
            "| MiB (CPU f32) | count | size | card (bf16) MiB | op | allocated in |",
            "|---|---|---|---|---|---|",
        ]
        scaled_total = 0.0
        for g in peak["live_at_peak"]:
            kind, scaled = describe(g["bytes"], tokens, chunk, card_tokens, card_chunk, g["code"])
            scaled_total += scaled * g["count"]
            if g["bytes"] * g["count"] < mib / 4:
                continue
            lines.append(
                f"| {g['bytes'] * g['count'] / mib:.1f} | {g['count']} | {kind} | "
                f"{scaled * g['count']:.0f} | {g['op']} | {' > '.join(g['code'][-3:])} |"
            )
        lines.append(f"\nScaled to the card's case: {scaled_total:.0f} MiB.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    parser.add_argument("--chunk", type=int, default=None, help="ours' layer chunk (CPU: 1024)")
    parser.add_argument("--systems", nargs="+", default=["ours", "stock"])
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "long_prompt_memory"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", action="store_true", help="only the report of --work's results")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(json.loads((args.work / "results.json").read_text()), args))
        return 0
    folder = build_model(args.work / f"qwen3-0.6b-shape-{args.layers}", args.layers)
    results = []
    for system in args.systems:
        print(f"[long_prompt_memory] {system} ...", flush=True)
        results.append(run_system(system, folder, args, args.work))
        (args.work / "results.json").write_text(json.dumps(results, indent=1))
    text = report(results, args)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
