"""The prefill path on a lent GPU: attention, hybrid prefilling and KV, measured (issue 48).

    # on the card, through the kit (scripts/gpu_kit/), one command:
    bash scripts/gpu_kit/run_on_card.sh                       # -> $OUT/gpu_prefill/
    # anywhere, tiny shapes on CPU (what tests/test_gpu_prefill_script.py runs):
    .venv/bin/python benchmarks/gpu_prefill.py --tiny --device cpu --out /tmp/gpu_prefill

Random tensors and random weights of Llama-3-8B's shapes (32 query heads, 8 KV heads, head
dim 128, hidden 4096, MLP 14336, 32 layers), bfloat16 on the card. No SGLang: the project's
own plain-torch pieces run as its scheduler runs them.

a. Attention. The project's FlashInfer prefill-only attention
   (features/prefill_attention/flashinfer_chunk.py: ragged causal over the chunk's own
   keys, paged prefix from the pool, merged by log-sum-exp) against torch SDPA, at 4k,
   16k and 32k tokens:
     cold            one prompt, no cached prefix: ours in the hybrid path's query chunks
                     (4096 rows, its CUDA default) and in one call; SDPA is_causal
     shared prefix   8 items of 512 tokens behind one cached prefix (the rest of the
                     length) held as a paged KV at scattered pool slots, one call for all
                     (page size 1, SGLang's pool); SDPA on the prefix gathered and
                     concatenated per item beforehand (not timed), lower-right causal mask
   Errors are max |out - reference| against float32 attention of the same bf16 inputs,
   for ours and for SDPA's own bf16 kernel; time is per layer (one call per layer, all its
   chunks), median of --repeats with the spread; FLOP/s counts the visible query-key pairs
   (4 x head dim x heads per pair) and is set against this card's bf16 matmul rate
   (an 8192^3 matmul, measured here).
b. Hybrid prefilling. The 8B-shaped Llama built on the card with transformers (bf16,
   random weights; --layers fewer if memory or time demand, recorded): a cold 32k and 64k
   prefill with the project's layer chunks (run_layer_in_chunks, the layers seen through
   harness/hf_llama_chunks.py, attention as in a.) vs transformers' plain forward (SDPA,
   no cache, last logits only): peak memory above the weights (CUDA's allocator peak),
   time, and the largest difference of the last position's log-probabilities.
c. Prefill-only KV. The same model's prefill keeping each layer's K / V for what the pool
   would hold: stock keeps every prompt token; prefill-only KV keeps the reusable prefix
   (prefill_kv/policy.kept_new_tokens, a 32k prompt whose last 512 tokens are the item),
   bytes measured as the memory still allocated after the forward.

Writes results.json and results.md to --out after each part (a part that fails records its
error and the next one runs); stops starting parts after --budget-s seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.hf_llama_chunks import hybrid_forward, plain_forward  # noqa: E402

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges  # noqa: E402
from prefillonly_sgl.features.hybrid_prefill.settings import LAYER_CHUNK_SIZE  # noqa: E402
from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import FlashInferQueryChunk  # noqa: E402
from prefillonly_sgl.features.prefill_attention.plan import Span, plan_query_chunk  # noqa: E402
from prefillonly_sgl.features.prefill_kv.policy import kept_new_tokens  # noqa: E402

LLAMA3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    rope_theta=500000.0,
    max_position_embeddings=131072,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    rope_theta=10000.0,
    max_position_embeddings=4096,
)
FULL = dict(
    attention_lengths=(4096, 16384, 32768),
    prefill_lengths=(32768, 65536),
    kv_length=32768,
    item_tokens=512,
    items=8,
    chunk=LAYER_CHUNK_SIZE["cuda"],
    layer_chunks=(4096, 2048),  # the CUDA default (2048, measured here) and the one before it
    matmul=8192,
)
SMALL = dict(
    attention_lengths=(96, 160),
    prefill_lengths=(160, 256),
    kv_length=160,
    item_tokens=16,
    items=4,
    chunk=48,
    layer_chunks=(48, 32),
    matmul=256,
)


PARTS = ("attention", "hybrid", "kv")

# ---------------------------------------------------------------- measuring


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int, warmup: int = 1) -> dict:
    """Median wall seconds of fn() over `repeats` calls after `warmup`, with the spread."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def peak_bytes(fn, device: str):
    """(fn's result, bytes allocated at its peak above what was allocated before; None off
    CUDA)."""
    if device != "cuda":
        return fn(), None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before


def matmul_flops(device: str, dtype, n: int, repeats: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t = timed(lambda: a @ b, device, repeats)
    return 2 * n**3 / t["median_s"]


# ---------------------------------------------------------------- attention (a)


class ProjectAttention:
    """The project's attention of one query chunk: FlashInfer on CUDA (the GPU backend's
    FlashInferQueryChunk, FA2 kernels), the CPU backend's QueryChunkAttention otherwise.
    Chunk objects are kept per (start, end) and their wrappers shared, as the scheduler's
    backend keeps them for a forward. kind "sdpa" (CUDA, only where FlashInfer failed, so
    that b. and c. still measure the layer chunks; recorded): SDPA per chunk, a single cold
    request only."""

    def __init__(self, spans: list[Span], prefix_slots: list, device: str, kind: str) -> None:
        self.spans, self.slots, self.device, self.kind = spans, prefix_slots, device, kind
        self.chunks: dict = {}
        self.wrappers: dict = {}
        self.workspace = (
            torch.empty(256 << 20, dtype=torch.uint8, device=device)
            if kind == "flashinfer"
            else None
        )

    def chunk(self, start: int, end: int):
        if (start, end) not in self.chunks:
            plan = plan_query_chunk(self.spans, start, end)
            if self.kind == "flashinfer":
                made = FlashInferQueryChunk(
                    plan,
                    self.spans,
                    self.slots,
                    self.workspace,
                    self.wrappers.setdefault(len(self.chunks), {}),  # one set per chunk
                    ragged_backend="fa2",
                )
            elif self.kind == "sdpa":
                if len(self.spans) != 1 or self.spans[0].prefix_len:
                    raise ValueError("the SDPA stand-in attends one cold request only")
                made = sdpa_query_chunk(start, end)
            else:
                from prefillonly_sgl.features.prefill_attention.query_chunk import (
                    QueryChunkAttention,
                )

                made = QueryChunkAttention(plan, self.spans, self.slots)
            self.chunks[start, end] = made
        return self.chunks[start, end]

    def __call__(self, q, k_all, v_all, k_pool, v_pool, scale, start: int, end: int):
        return self.chunk(start, end)(q, k_all, v_all, k_pool, v_pool, scale)


def sdpa_query_chunk(start: int, end: int):
    """Rows [start, end) of one cold request against keys [0, end), lower-right causal."""

    def attend(q, k_all, v_all, k_pool, v_pool, scale):
        g = q.shape[1] // k_all.shape[1]
        k = k_all[:end].repeat_interleave(g, dim=1).transpose(0, 1)[None]
        v = v_all[:end].repeat_interleave(g, dim=1).transpose(0, 1)[None]
        o = lower_right_sdpa(q.transpose(0, 1)[None], k, v, scale)
        return o[0].transpose(0, 1)

    return attend


def attention_kind(device: str, dtype, shapes: dict, results: dict) -> str:
    """ "flashinfer" on CUDA when a small call of the project's FlashInfer chunk runs (its
    first call compiles the kernels: the seconds are recorded), else "sdpa" with the
    error recorded; "cpu" off CUDA."""
    if device != "cuda":
        return "cpu"
    heads, kv_heads = shapes["num_attention_heads"], shapes["num_key_value_heads"]
    d = shapes["hidden_size"] // heads
    started = time.perf_counter()
    try:
        n = 256
        q = torch.randn(n, heads, d, device=device, dtype=dtype)
        k = torch.randn(n, kv_heads, d, device=device, dtype=dtype)
        pool = torch.randn(64, kv_heads, d, device=device, dtype=dtype)
        slots = torch.arange(1, 33, device=device)
        spans = [Span(0, 0, 128), Span(128, 32, 128)]  # cold, and behind a cached prefix
        attention = ProjectAttention(spans, [None, slots], device, "flashinfer")
        attention(q, k, k, pool, pool, d**-0.5, 0, n)
        torch.cuda.synchronize()
    except Exception:
        results["errors"]["flashinfer"] = traceback.format_exc()
        print(results["errors"]["flashinfer"], file=sys.stderr)
        return "sdpa"
    finally:
        results["flashinfer_first_call_s"] = time.perf_counter() - started
    return "flashinfer"


def reference_attention(q, k, v, visible_from: int, scale: float, block: int = 1024):
    """float32 attention of q (n, H, D) against k / v (m, Hkv, D): query i sees keys
    [0, visible_from + i]. Computed in query blocks (bounded memory)."""
    n, heads, _ = q.shape
    g = heads // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1).transpose(0, 1)  # (H, m, D)
    vf = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    keys = torch.arange(k.shape[0], device=q.device)
    for s in range(0, n, block):
        e = min(n, s + block)
        last = visible_from + e - 1
        mask = (
            keys[None, : last + 1] <= (visible_from + torch.arange(s, e, device=q.device))[:, None]
        )
        qb = q[s:e].float().transpose(0, 1)
        o = F.scaled_dot_product_attention(
            qb, kf[:, : last + 1], vf[:, : last + 1], attn_mask=mask, scale=scale
        )
        out[s:e] = o.transpose(0, 1)
    return out


def lower_right_sdpa(q, k, v, scale):
    """SDPA of q (B, H, n, D) against k / v (B, H, m, D), query i seeing keys [0, m - n + i]."""
    from torch.nn.attention.bias import causal_lower_right

    n, m = q.shape[2], k.shape[2]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, m), scale=scale)


def attention_case(kind: str, length: int, shapes: dict, sizes: dict, args, device, dtype) -> dict:
    """One row of a.: SDPA and the project's attention on the same random tensors."""
    heads, kv_heads = shapes["num_attention_heads"], shapes["num_key_value_heads"]
    d = shapes["hidden_size"] // heads
    scale = d**-0.5
    gen = torch.Generator(device=device).manual_seed(length)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    row = {"case": kind, "tokens": length}
    if kind == "cold":
        q, k, v = randn(length, heads, d), randn(length, kv_heads, d), randn(length, kv_heads, d)
        spans, slots, pool = [Span(0, 0, length)], [None], (None, None)
        pairs = length * (length + 1) // 2
        ref = reference_attention(q, k, v, 0, scale)
        qt, kt, vt = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))

        def sdpa():
            return F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True
            )

        row["items"], row["prefix"] = 1, 0
    else:
        n, items = sizes["item_tokens"], sizes["items"]
        prefix = length - n
        pool_slots = prefix + 1024
        perm = (
            torch.randperm(pool_slots - 1, generator=torch.Generator().manual_seed(0))[:prefix] + 1
        )
        slot_ids = perm.to(device)
        k_pool, v_pool = randn(pool_slots, kv_heads, d), randn(pool_slots, kv_heads, d)
        q, k, v = (
            randn(items * n, heads, d),
            randn(items * n, kv_heads, d),
            randn(items * n, kv_heads, d),
        )
        spans = [Span(i * n, prefix, n) for i in range(items)]
        slots, pool = [slot_ids] * items, (k_pool, v_pool)
        pairs = items * (n * prefix + n * (n + 1) // 2)
        k_pre, v_pre = k_pool[slot_ids], v_pool[slot_ids]
        ref = torch.cat(
            [
                reference_attention(
                    q[i * n : (i + 1) * n],
                    torch.cat([k_pre, k[i * n : (i + 1) * n]]),
                    torch.cat([v_pre, v[i * n : (i + 1) * n]]),
                    prefix,
                    scale,
                )
                for i in range(items)
            ]
        )
        g = heads // kv_heads

        def stacked(own, pre):  # (items, H, prefix + n, D), heads expanded
            per_item = [torch.cat([pre, own[i * n : (i + 1) * n]]) for i in range(items)]
            return torch.stack(per_item).repeat_interleave(g, dim=2).transpose(1, 2).contiguous()

        kt, vt = stacked(k, k_pre), stacked(v, v_pre)
        qt = q.view(items, n, heads, d).transpose(1, 2).contiguous()

        def sdpa():
            return lower_right_sdpa(qt, kt, vt, scale)

        row["items"], row["prefix"] = items, prefix
    row["flop"] = 4 * d * heads * pairs
    out_sdpa = sdpa()
    if kind != "cold":
        out_sdpa = out_sdpa.transpose(1, 2).reshape(-1, heads, d)
    else:
        out_sdpa = out_sdpa[0].transpose(0, 1)
    row["sdpa_max_err"] = (out_sdpa.float() - ref).abs().max().item()
    row["sdpa"] = timed(sdpa, device, args.repeats)
    del out_sdpa

    if args.attention_kind == "sdpa":
        return row  # the SDPA stand-in: SDPA's row only
    total = q.shape[0]
    variants = {"ours, one call": [(0, total)]}
    if kind == "cold" and total > sizes["chunk"]:
        variants[f"ours, chunks of {sizes['chunk']}"] = chunk_ranges(total, sizes["chunk"])
    for name, ranges in variants.items():
        attention = ProjectAttention(spans, slots, device, args.attention_kind)
        out = torch.empty_like(q)

        def ours(attention=attention, ranges=ranges, out=out):
            for s, e in ranges:
                out[s:e] = attention(q[s:e], k, v, pool[0], pool[1], scale, s, e)
            return out

        timing = timed(ours, device, args.repeats)  # its warm-up call fills `out`
        row[name] = {"max_err": (out.float() - ref).abs().max().item(), **timing}
    return row


def part_attention(shapes, sizes, args, device, dtype, results) -> None:
    rate = matmul_flops(device, dtype, sizes["matmul"], args.repeats)
    results["matmul_flop_per_s"] = rate
    rows = results.setdefault("attention", [])
    for length in sizes["attention_lengths"]:
        for kind in ("cold", "shared prefix"):
            row = attention_case(kind, length, shapes, sizes, args, device, dtype)
            for key in [k for k in row if isinstance(row[k], dict)]:
                row[key]["flop_per_s"] = row["flop"] / row[key]["median_s"]
                row[key]["of_matmul"] = row[key]["flop_per_s"] / rate
            rows.append(row)
            write(results, args.out)


# ---------------------------------------------------------------- model (b, c)


def build_model(shapes: dict, layers: int, device: str, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**shapes, "num_hidden_layers": layers}, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def project_attend(length: int, device: str, kind: str, keep=None):
    """attend_for_layer for hybrid_forward: one cold request of `length` tokens attended
    by the project's query chunks; keep(layer, k_all, v_all, end) sees every chunk."""
    attention = ProjectAttention([Span(0, 0, length)], [None], device, kind)

    def for_layer(index: int):
        def attend(q, k_all, v_all, start, end):
            if keep is not None:
                keep(index, k_all, v_all, end)
            d = k_all.shape[-1]
            q = q.view(end - start, -1, d)
            o = attention(q, k_all, v_all, None, None, d**-0.5, start, end)
            return o.reshape(end - start, -1)

        return attend

    return for_layer


def part_hybrid(model, shapes, sizes, args, device, results) -> None:
    rows = results.setdefault("hybrid_prefill", [])
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    results["model"] = {
        "layers": model.config.num_hidden_layers,
        "weights_mib": weights / 2**20,
        "shapes": {k: v for k, v in shapes.items() if k != "num_hidden_layers"},
    }
    for length in sizes["prefill_lengths"]:
        ids = torch.randint(0, shapes["vocab_size"], (length,), device=device)
        row = {"tokens": length, "chunks": {}}

        def plain(ids=ids):
            return plain_forward(model, ids)

        plain_logits, peak = peak_bytes(plain, device)
        row["plain"] = {"peak_bytes": peak, **timed(plain, device, args.model_repeats, warmup=0)}
        for chunk in sizes["layer_chunks"]:
            attend = project_attend(length, device, args.attention_kind)

            def ours(chunk=chunk, attend=attend, ids=ids):
                return hybrid_forward(model, ids, chunk, attend)

            logits, peak = peak_bytes(ours, device)
            entry = {"peak_bytes": peak, **timed(ours, device, args.model_repeats, warmup=0)}
            entry["max_logprob_diff"] = (
                (plain_logits.float().log_softmax(-1) - logits.float().log_softmax(-1))
                .abs()
                .max()
                .item()
            )
            if row["plain"]["peak_bytes"] and peak:
                entry["peak_ratio"] = row["plain"]["peak_bytes"] / peak
            entry["time_ratio"] = entry["median_s"] / row["plain"]["median_s"]
            row["chunks"][str(chunk)] = entry
            del logits
        rows.append(row)
        del plain_logits
        if device == "cuda":
            torch.cuda.empty_cache()
        write(results, args.out)


def part_kv(model, shapes, sizes, args, device, results) -> None:
    length = sizes["kv_length"]
    reusable = length - sizes["item_tokens"]
    ids = torch.randint(0, shapes["vocab_size"], (length,), device=device)
    out = {"tokens": length, "reusable_prefix": reusable}
    for name, kept_tokens in (
        ("stock (every token)", length),
        ("prefill-only (reusable prefix)", kept_new_tokens(0, length, length, reusable)),
    ):
        pool: dict = {}

        def keep(layer, k_all, v_all, end, pool=pool, kept_tokens=kept_tokens):
            if layer not in pool and end >= kept_tokens:
                pool[layer] = (k_all[:kept_tokens].clone(), v_all[:kept_tokens].clone())

        synchronize(device)
        before = torch.cuda.memory_allocated() if device == "cuda" else 0
        attend = project_attend(length, device, args.attention_kind, keep)
        hybrid_forward(model, ids, sizes["chunk"], attend)
        del attend
        gc.collect()
        synchronize(device)
        if device == "cuda":
            kept_bytes = torch.cuda.memory_allocated() - before
        else:
            kept_bytes = sum(k.nbytes + v.nbytes for k, v in pool.values())
        out[name] = {
            "tokens_kept": kept_tokens,
            "bytes": kept_bytes,
            "bytes_per_kept_token": kept_bytes / kept_tokens,
            "bytes_per_prompt_token": kept_bytes / length,
        }
        del pool
    heads_dim = shapes["hidden_size"] // shapes["num_attention_heads"]
    element = torch.empty((), dtype=next(model.parameters()).dtype).element_size()
    out["expected_bytes_per_token"] = (
        2 * model.config.num_hidden_layers * shapes["num_key_value_heads"] * heads_dim * element
    )
    results["kv"] = out
    write(results, args.out)


# ---------------------------------------------------------------- report


def write(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(markdown(results))


def _ms(entry: dict) -> str:
    return f"{entry['median_s'] * 1e3:.2f} ({entry['min_s'] * 1e3:.2f}-{entry['max_s'] * 1e3:.2f})"


def _s(entry: dict) -> str:
    return f"{entry['median_s']:.3f} ({entry['min_s']:.3f}-{entry['max_s']:.3f})"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f}"


def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [
        f"# Prefill path on {env['device_name']}",
        "",
        "```",
        json.dumps(env, indent=1),
        "```",
        "",
    ]
    kind = results.get("attention_kind")
    if kind == "flashinfer":
        lines += [
            f"FlashInfer's first call (its FA2 and merge-state kernels compiled): "
            f"{results['flashinfer_first_call_s']:.1f} s",
            "",
        ]
    elif kind == "sdpa" and "flashinfer" not in results.get("errors", {}):
        lines += ["Attention: the SDPA stand-in (--attention sdpa).", ""]
    elif kind == "sdpa":
        lines += [
            "**FlashInfer failed on this machine (its error is at the end): a. has SDPA's rows "
            "only, and b. / c. attend each query chunk with SDPA instead.**",
            "",
        ]
    if "matmul_flop_per_s" in results:
        rate = results["matmul_flop_per_s"] / 1e12
        lines += [f"{env['dtype']} matmul rate measured: {rate:.2f} TFLOP/s", ""]
    if results.get("attention"):
        lines += [
            "## a. Attention per layer: ms median (min-max), max error vs float32, "
            "share of the matmul rate",
            "",
            "| case | tokens | method | ms | max error | TFLOP/s | of matmul |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
        ]
        for row in results["attention"]:
            for method in [k for k in row if isinstance(row[k], dict)]:
                entry = row[method]
                err = entry.get("max_err", row.get("sdpa_max_err"))
                lines.append(
                    f"| {row['case']} | {row['tokens']} | {method} | {_ms(entry)} | {err:.2e} | "
                    f"{entry['flop_per_s'] / 1e12:.1f} | {entry['of_matmul']:.0%} |"
                )
        lines.append("")
    if results.get("hybrid_prefill"):
        model = results["model"]
        lines += [
            f"## b. Hybrid prefilling: {model['layers']} layers, "
            f"weights {model['weights_mib']:,.1f} MiB",
            "",
            "| tokens | forward | peak MiB above weights | s median (min-max) | peak, plain / ours "
            "| time, ours / plain | max logprob diff |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in results["hybrid_prefill"]:
            plain = row["plain"]
            lines.append(
                f"| {row['tokens']} | plain | {_mib(plain['peak_bytes'])} | {_s(plain)} | | | |"
            )
            for chunk, entry in row["chunks"].items():
                ratio = f"{entry['peak_ratio']:.1f}x" if "peak_ratio" in entry else "n/a"
                lines.append(
                    f"| {row['tokens']} | layer chunks of {chunk} | {_mib(entry['peak_bytes'])} | "
                    f"{_s(entry)} | {ratio} | {entry['time_ratio']:.2f}x | "
                    f"{entry['max_logprob_diff']:.2e} |"
                )
        lines.append("")
    if results.get("kv"):
        kv = results["kv"]
        lines += [
            f"## c. KV kept for a {kv['tokens']}-token prompt "
            f"(reusable prefix {kv['reusable_prefix']})",
            "",
            "| pool keeps | tokens | MiB | bytes per kept token | bytes per prompt token |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name in ("stock (every token)", "prefill-only (reusable prefix)"):
            e = kv[name]
            lines.append(
                f"| {name} | {e['tokens_kept']} | {e['bytes'] / 2**20:,.1f} | "
                f"{e['bytes_per_kept_token']:,.0f} | {e['bytes_per_prompt_token']:,.0f} |"
            )
        lines += [
            "",
            "Expected per token (2 x layers x KV heads x head dim x bytes): "
            f"{kv['expected_bytes_per_token']:,}",
            "",
        ]
    for part, error in results.get("errors", {}).items():
        lines += [f"**{part} failed:**", "", "```", error, "```", ""]
    return "\n".join(lines)


def environment(device: str, dtype) -> dict:
    import transformers

    env = {
        "device_name": torch.cuda.get_device_name()
        if device == "cuda"
        else platform.processor() or "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    if device == "cuda":
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        try:
            import flashinfer

            env["flashinfer"] = flashinfer.__version__
        except Exception as error:  # recorded: part a. and b. say what failed
            env["flashinfer"] = f"not importable: {error}"
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gpu_prefill"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU test)")
    parser.add_argument(
        "--layers", type=int, default=None, help="decoder layers of the model (b, c)"
    )
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, in order")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model-repeats", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=300.0, help="start no part after this")
    parser.add_argument(
        "--attention",
        choices=("auto", "sdpa"),
        default="auto",
        help="auto: FlashInfer on CUDA (SDPA if it fails), the CPU backend on CPU; sdpa: "
        "the stand-in (b. and c. only)",
    )
    args = parser.parse_args(argv)
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes, sizes = (TINY, SMALL) if args.tiny else (LLAMA3_8B, FULL)
    layers = args.layers or shapes["num_hidden_layers"]
    results = {
        "environment": environment(device, dtype),
        "command": " ".join(sys.argv),
        "errors": {},
    }
    started = time.perf_counter()
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    if args.attention == "auto":
        args.attention_kind = attention_kind(device, dtype, shapes, results)
    else:
        args.attention_kind = args.attention
    results["attention_kind"] = args.attention_kind
    write(results, args.out)
    model = None
    for part in parts:
        elapsed = time.perf_counter() - started
        if elapsed > args.budget_s:
            results["errors"][part] = (
                f"not started: {elapsed:.0f} s of the {args.budget_s:.0f} s budget spent"
            )
            continue
        try:
            part_started = time.perf_counter()
            if part == "attention":
                part_attention(shapes, sizes, args, device, dtype, results)
            else:
                if model is None:
                    model = build_model(shapes, layers, device, dtype)
                (part_hybrid if part == "hybrid" else part_kv)(
                    model, shapes, sizes, args, device, results
                )
            results.setdefault("part_seconds", {})[part] = time.perf_counter() - part_started
        except Exception:
            results["errors"][part] = traceback.format_exc()
            print(results["errors"][part], file=sys.stderr)
        write(results, args.out)
    print(markdown(results))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
