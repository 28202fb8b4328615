"""Where a forward's time goes, what batching cache hits buys, and how far from the floor
(issue 22).

    .venv/bin/python benchmarks/forward_profile.py                 # ~4 min on the 2-core CPU
    .venv/bin/python benchmarks/forward_profile.py --dtype float32

Two engines on the default model, both running, taking turns call by call on the same
prompts (an idle engine sleeps; drifts in the machine's speed hit both alike), SGLang's
fcfs order (so k items sent in one call run as ONE extend batch): "before", prefill-only
attention with every hit attending to its prefix on its own
(PREFILLONLY_SHARED_PREFIX_ATTENTION=0, the path before issue 22), and "after", hits
behind one cached prefix as a shared-prefix group.
Each scores, behind a cached prefix of P random tokens, k items of n tokens in one call
(k = 1, 2, 4, 8, 16), for (P, n) = (1000, 30): MovieLens-like film lines, and (1500,
128); then cold prompts of 1k and 2k tokens. The forward-profile instrument
(sglang_runtime/forward_profile/) records, per extend batch, the scheduler step, the
forward, the attention plan and each kind of module inside it.

The floor, measured in this process after the sweep: the four linear layers at the
batch's tokens (matmuls of the model's shapes, a weight set per layer as in the model, so
small batches pay for reading the weights) plus its attention at the fused SDPA
kernel's own rate, times the layers. Attention for hits: all the batch's queries
against the prefix in one unmasked call (the kernel's best shape) and each item's own
causal pairs at the same rate; cold: one causal call. It leaves out norms, rotary,
activation, logits and SGLang's own work.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_attention import _best, model_shapes  # noqa: E402

KS = (1, 2, 4, 8, 16)
HIT_SHAPES = ((1000, 30), (1500, 128))
COLD = (1024, 2048)
KINDS = ("linear", "attention", "norm", "rotary", "activation", "logits", "embedding")
SYSTEMS = {"before": "0", "after": "1"}


def start_engine(name: str, dtype: str, profile: Path):
    """An engine for `name`; its scheduler inherits the two variables at start."""
    import prefillonly_sgl

    os.environ["PREFILLONLY_FORWARD_PROFILE"] = str(profile)
    os.environ["PREFILLONLY_SHARED_PREFIX_ATTENTION"] = SYSTEMS[name]
    profile.unlink(missing_ok=True)
    try:
        return prefillonly_sgl.Engine(dtype=dtype, schedule_policy="fcfs", max_total_tokens=32768)
    finally:
        del os.environ["PREFILLONLY_FORWARD_PROFILE"]
        del os.environ["PREFILLONLY_SHARED_PREFIX_ATTENTION"]


def run_sweep(engines: dict, profiles: dict, reps: int) -> list[dict]:
    """The sweep on both engines at once, taking turns call by call on the same prompts
    (an idle engine sleeps), so drifts in the machine's speed hit both alike. One row per
    measured call, with the forward profile of its extend batch(es)."""
    rng = random.Random(0)
    vocab = next(iter(engines.values())).tokenizer.vocab_size

    def ids(n):
        return [rng.randrange(1000, vocab - 1) for _ in range(n)]

    labels = [100, 200]
    rows = []

    def timed(kind, prefix, items, **key):
        for name, engine in engines.items():
            lines_before = _lines(profiles[name])
            start = time.perf_counter()
            engine.score(prefix, items, labels)
            seconds = time.perf_counter() - start
            batches = _lines(profiles[name])[len(lines_before) :]
            rows.append(dict(system=name, kind=kind, call_s=seconds, batches=batches, **key))

    for prefix_len, n in HIT_SHAPES:
        prefix = ids(prefix_len)
        for engine in engines.values():
            engine.score(prefix, [ids(8)], labels)  # cache the prefix
        for _ in range(reps):
            for k in KS:
                timed("hit", prefix, [ids(n) for _ in range(k)], P=prefix_len, n=n, k=k)
    for _ in range(reps):
        for length in COLD:
            timed("cold", ids(length), [ids(8)], P=0, n=length + 8, k=1)
    return rows


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def floors(dtype: str, model_config: dict, reps: int) -> dict:
    """Floor seconds per (kind, P, n, k) of the sweep."""
    import torch
    import torch.nn.functional as F

    s = model_shapes(model_config)
    dt = getattr(torch, dtype)
    heads, kv, d, layers = s["heads"], s["kv_heads"], s["head_dim"], s["layers"]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    qkv_out = (heads + 2 * kv) * d
    shapes = [
        (s["hidden"], qkv_out),
        (heads * d, s["hidden"]),
        (s["hidden"], 2 * s["intermediate"]),
        (s["intermediate"], s["hidden"]),
    ]
    # One weight set per layer, as in the model: a small batch's matmuls stream every
    # layer's weights from memory (one set reused would sit in the cache and flatter it).
    weights = [[torch.randn(o, i, dtype=dt) for i, o in shapes] for _ in range(layers)]

    def linear(tokens):
        xs = [torch.randn(tokens, i, dtype=dt) for i, _ in shapes]
        return _best(lambda: [F.linear(x, w) for ws in weights for x, w in zip(xs, ws)], reps)

    out = {}
    for prefix_len, n in HIT_SHAPES:
        kp = torch.randn(1, kv, prefix_len, d, dtype=dt)
        vp = torch.randn_like(kp)
        for k in KS:
            q = torch.randn(1, kv, (heads // kv) * k * n, d, dtype=dt)
            prefix_part = _best(lambda q=q, kp=kp, vp=vp: flash(q, kp, vp), reps)
            attention = prefix_part * (prefix_len + (n + 1) / 2) / prefix_len  # + own pairs
            lin = linear(k * n)
            out["hit", prefix_len, n, k] = dict(linear=lin, attention=layers * attention)
    for length in COLD:
        n = length + 8
        q = torch.randn(1, heads, n, d, dtype=dt)
        kk = torch.randn(1, kv, n, d, dtype=dt)
        attention = _best(
            lambda q=q, kk=kk: F.scaled_dot_product_attention(
                q, kk, kk, is_causal=True, enable_gqa=True
            ),
            reps,
        )
        out["cold", 0, n, 1] = dict(linear=linear(n), attention=layers * attention)
    for value in out.values():
        value["floor"] = value["linear"] + value["attention"]
    return out


def summarise(rows: list[dict]) -> dict:
    """(system, kind, P, n, k) -> the rep with the least call time (its batch profile)."""
    best: dict = {}
    for row in rows:
        if len(row["batches"]) != 1:
            continue  # the call ran as more than one batch: not a k-batch measurement
        key = (row["system"], row["kind"], row["P"], row["n"], row["k"])
        if key not in best or row["call_s"] < best[key]["call_s"]:
            best[key] = row
    return best


def render(best: dict, floor: dict, header: str) -> str:
    lines = [header, ""]
    lines += ["**Breakdown** (seconds of one extend batch; best of the reps)", ""]
    lines.append(
        "| batch | system | call | step | forward | "
        + " | ".join(KINDS)
        + " | other | plan | floor | forward / floor |"
    )
    lines.append("|" + "---|" * (len(KINDS) + 9))
    shown = [("hit", 1000, 30, 1), ("hit", 1000, 30, 8), ("hit", 1500, 128, 1),
             ("hit", 1500, 128, 8), ("cold", 0, 2056, 1)]  # fmt: skip
    for kind, p, n, k in shown:
        for system in SYSTEMS:
            row = best.get((system, kind, p, n, k))
            if row is None:
                continue
            b = row["batches"][0]
            mods = b["modules_s"]
            other = b["forward_s"] - sum(mods.values())
            f = floor[kind, p, n, k]["floor"]
            label = f"{k} x {n} behind {p}" if kind == "hit" else f"cold {n}"
            lines.append(
                f"| {label} | {system} | {row['call_s']:.3f} | {b['step_s']:.3f} | "
                f"{b['forward_s']:.3f} | "
                + " | ".join(f"{mods.get(m, 0.0):.3f}" for m in KINDS)
                + f" | {other:.3f} | {b['plan_s']:.4f} | {f:.3f} | {b['forward_s'] / f:.2f} |"
            )
    lines += ["", "**Batch scaling** (k hits in one call; ratio = call / (k x the k=1 call))", ""]
    lines.append(
        "| P | n | k | before s | before ratio | after s | after ratio | after per item | "
        "floor s | after / floor |"
    )
    lines.append("|" + "---|" * 10)
    for p, n in HIT_SHAPES:
        for k in KS:
            cells = []
            for system in SYSTEMS:
                row, one = best.get((system, "hit", p, n, k)), best.get((system, "hit", p, n, 1))
                if row is None or one is None:
                    cells += ["-", "-"]
                    continue
                cells += [f"{row['call_s']:.3f}", f"{row['call_s'] / (k * one['call_s']):.2f}"]
            after = best.get(("after", "hit", p, n, k))
            f = floor["hit", p, n, k]["floor"]
            per_item = f"{after['call_s'] / k:.3f}" if after else "-"
            ratio = f"{after['batches'][0]['forward_s'] / f:.2f}" if after else "-"
            lines.append(
                f"| {p} | {n} | {k} | " + " | ".join(cells) + f" | {per_item} | {f:.3f} | {ratio} |"
            )
    for length in COLD:
        n = length + 8
        f = floor["cold", 0, n, 1]
        row = best.get(("after", "cold", 0, n, 1))
        if row:
            lines.append(
                f"\ncold {n}: forward {row['batches'][0]['forward_s']:.3f} s, floor "
                f"{f['floor']:.3f} s (linear {f['linear']:.3f} + attention {f['attention']:.3f})"
                f" -> {row['batches'][0]['forward_s'] / f['floor']:.2f}x"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()

    from prefillonly_sgl.models.default_model import default_model_path

    config = json.loads((Path(default_model_path()) / "config.json").read_text())
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        profiles = {name: Path(tmp) / f"{name}.jsonl" for name in SYSTEMS}
        engines = {}
        try:
            for name in SYSTEMS:
                engines[name] = start_engine(name, args.dtype, profiles[name])
            print("[forward_profile] sweep, engines taking turns ...", flush=True)
            rows = run_sweep(engines, profiles, args.reps)
        finally:
            for engine in engines.values():
                engine.shutdown()
    print("[forward_profile] floor ...", flush=True)
    floor = floors(args.dtype, config, args.reps)
    load = os.getloadavg()[0]
    header = (
        f"Machine: {platform.machine()} ({platform.processor() or 'cpu'}), {os.cpu_count()} cores,"
        f" load {load:.1f} at the end; default model, {args.dtype}; started {started}; "
        f"floor = layers x (4 linear layers + fused SDPA at its rate), in this process"
    )
    text = render(summarise(rows), floor, header)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"forward_profile-{args.dtype}-{stamp}.md").write_text(text)
    (args.out / f"forward_profile-{args.dtype}-{stamp}.json").write_text(
        json.dumps(dict(rows=rows, floor={"|".join(map(str, k)): v for k, v in floor.items()}))
    )


if __name__ == "__main__":
    main()
