"""A Qwen3.5-shaped hybrid (Gated DeltaNet 3 : 1 full attention) at the paper's workload:
users x items behind long profiles, prefix-cached states against recomputing the profile,
in one run (issue 53).

    PYTHONPATH=. .venv/bin/python benchmarks/hybrid_prefix_states.py
    PYTHONPATH=. .venv/bin/python benchmarks/hybrid_prefix_states.py --users 4 --items 8 \\
        --profile-tokens 1024 --item-tokens 32 --repeats 3 --device cuda --dtype bfloat16

The model: random weights in the shape of Qwen3.5's smallest published text stack (hidden
1024, 24 layers of which every 4th is full attention, 8 query / 2 KV heads of 256, 16 + 16
linear heads of 128, MLP 3584), with the tests' 400-token tokenizer (the published
vocabulary of 248k would add a large LM head that is the same work in every system). A
user's call is one Engine.score with the user's profile as the query and its items (random
token ids), two labels.

Systems, each in its own engine, the same KV pool (--pool tokens):
- ours: prefill-only KV (the profile's state kept as one snapshot at its end; items behind
  it compute only their own tokens), the JCT scheduler and every default feature;
- recompute: ours with prefill_only_kv=False (no snapshot: every item recomputes the
  profile, as a hybrid model runs in stock SGLang);
- stock: stock SGLang (STOCK_SGLANG), with SGLang's no_buffer mamba cache.
Reported per system: items per second (median of --repeats runs, with the spread), tokens
computed (prompt tokens minus cached ones, from the calls' usage), and the bytes one cached
profile costs: its full-attention KV plus one state snapshot, against the KV of a dense
model of the same width (every layer full attention), computed from the shapes SGLang's
pools use (the KV at the engine's dtype, the states: conv at the conv dtype, the recurrent
state in float32).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import random
import statistics
import time
from pathlib import Path

SHAPE = dict(  # Qwen3.5's smallest published text stack (0.8B with its vocabulary)
    hidden_size=1024,
    num_hidden_layers=24,
    intermediate_size=3584,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)
FULL_ATTENTION_INTERVAL = 4


def text_config_fields(tok) -> dict:
    """Qwen3_5TextConfig's fields for SHAPE with tokenizer `tok`
    (models/tiny_decision_checkpoints.py's Kev backbone has the same)."""
    layers = SHAPE["num_hidden_layers"]
    return dict(
        **SHAPE,
        vocab_size=len(tok),
        layer_types=[
            "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
            for i in range(layers)
        ],
        full_attention_interval=FULL_ATTENTION_INTERVAL,
        max_position_embeddings=32768,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def build_model(out: Path, dtype: str) -> Path:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from prefillonly_sgl.models.tiny import build_tokenizer

    if (out / "config.json").exists():
        return out
    tok = build_tokenizer()
    config = Qwen3_5TextConfig(**text_config_fields(tok), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prefix_bytes(profile_tokens: int, kv_bytes: int, conv_bytes: int = 2) -> dict:
    """What one cached profile holds: full-attention KV for its tokens plus one state
    snapshot (every linear layer's conv window and recurrent state), against a dense
    model of the same width whose every layer keeps KV."""
    layers = SHAPE["num_hidden_layers"]
    full = layers // FULL_ATTENTION_INTERVAL
    linear = layers - full
    kv_per_token_layer = 2 * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * kv_bytes
    conv_dim = (
        2 * SHAPE["linear_num_key_heads"] * SHAPE["linear_key_head_dim"]
        + SHAPE["linear_num_value_heads"] * SHAPE["linear_value_head_dim"]
    )
    conv = conv_dim * (SHAPE["linear_conv_kernel_dim"] - 1) * conv_bytes
    state = (
        SHAPE["linear_num_value_heads"]
        * SHAPE["linear_value_head_dim"]
        * SHAPE["linear_key_head_dim"]
        * 4
    )
    hybrid_kv = full * kv_per_token_layer * profile_tokens
    snapshot = linear * (conv + state)
    dense = layers * kv_per_token_layer * profile_tokens
    return dict(
        hybrid_kv=hybrid_kv,
        snapshot=snapshot,
        hybrid_total=hybrid_kv + snapshot,
        dense_kv=dense,
        dense_tokens_equal_to_snapshot=snapshot / (layers * kv_per_token_layer),
    )


def _run_system(name, model, args, workload, queue) -> None:
    from prefillonly_sgl import STOCK_SGLANG, Engine

    options = dict(device=args.device, dtype=args.dtype, max_total_tokens=args.pool)
    if name == "recompute":
        options["prefill_only_kv"] = False
    if name == "stock":
        options.update(STOCK_SGLANG)
        # SGLang's own requirements for a hybrid model off CUDA (the family defaults ours
        # gets from models/families.py): no_buffer mamba cache, no overlapped scheduler
        options.update(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
    labels = [5, 6]
    runs = []
    with Engine(model, **options) as engine:
        engine.score(workload[0][0][:64], [workload[0][1][0][:8]], labels)  # warm-up
        for repeat in range(args.repeats):
            computed = prompt = 0
            start = time.perf_counter()
            for profile, items in workload:
                # a fresh profile per repeat: nothing cached from the repeat before
                result = engine.score([repeat + 7] + profile, items, labels)
                prompt += result.prompt_tokens
                computed += result.prompt_tokens - result.cached_tokens
            seconds = time.perf_counter() - start
            runs.append(dict(seconds=seconds, prompt_tokens=prompt, computed_tokens=computed))
            print(
                f"[{name}] repeat {repeat}: {seconds:.1f}s, {computed} tokens computed", flush=True
            )
    queue.put((name, runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--profile-tokens", type=int, default=1024)
    parser.add_argument("--item-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pool", type=int, default=16384, help="KV pool tokens (all systems)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--systems", default="ours,recompute,stock")
    parser.add_argument("--model-dir", default="build/bench-qwen3_5-0.8b-shape")
    parser.add_argument("--out", default="benchmarks/hybrid_results/hybrid_prefix_states.json")
    args = parser.parse_args()

    model = str(build_model(Path(args.model_dir), args.dtype))
    rng = random.Random(0)
    vocab = 300  # token ids of the tiny tokenizer, specials left out
    workload = [
        (
            [rng.randrange(10, vocab) for _ in range(args.profile_tokens)],
            [
                [rng.randrange(10, vocab) for _ in range(args.item_tokens)]
                for _ in range(args.items)
            ],
        )
        for _ in range(args.users)
    ]
    results = {}
    ctx = mp.get_context("spawn")
    for name in args.systems.split(","):
        queue = ctx.Queue()
        child = ctx.Process(target=_run_system, args=(name, model, args, workload, queue))
        child.start()
        name_runs = queue.get()
        child.join()
        results[name_runs[0]] = name_runs[1]

    kv_bytes = 2 if args.dtype in ("bfloat16", "float16") else 4
    conv_bytes = 4 if args.dtype == "float32" else 2
    sizes = prefix_bytes(args.profile_tokens, kv_bytes, conv_bytes)
    items = args.users * args.items
    report = dict(
        machine=platform.processor() or platform.machine(),
        settings=vars(args),
        prefix_bytes=sizes,
        systems={
            name: dict(
                items_per_s=[items / r["seconds"] for r in runs],
                computed_tokens=runs[0]["computed_tokens"],
                prompt_tokens=runs[0]["prompt_tokens"],
            )
            for name, runs in results.items()
        },
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(
        f"\n{args.users} users x {args.items} items, profile {args.profile_tokens} tokens, "
        f"items {args.item_tokens}, {args.dtype} on {args.device}, {args.repeats} repeats"
    )
    print("| system | items/s (median) | spread | tokens computed | vs recompute |")
    print("|---|---|---|---|---|")
    base = statistics.median(report["systems"].get("recompute", {}).get("items_per_s", [1]))
    for name, row in report["systems"].items():
        rates = row["items_per_s"]
        median = statistics.median(rates)
        print(
            f"| {name} | {median:.2f} | {min(rates):.2f}-{max(rates):.2f} | "
            f"{row['computed_tokens']} of {row['prompt_tokens']} | {median / base:.2f}x |"
        )
    mib = 2**20
    print(
        f"\none cached profile of {args.profile_tokens} tokens: full-attention KV "
        f"{sizes['hybrid_kv'] / mib:.1f} MiB + one state snapshot {sizes['snapshot'] / mib:.1f} "
        f"MiB = {sizes['hybrid_total'] / mib:.1f} MiB; a dense model of the same width: "
        f"{sizes['dense_kv'] / mib:.1f} MiB (the snapshot weighs as much as "
        f"{sizes['dense_tokens_equal_to_snapshot']:.0f} tokens of dense KV)"
    )


if __name__ == "__main__":
    main()
