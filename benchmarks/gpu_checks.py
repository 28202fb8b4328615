"""Correctness on a card for what no card has run: classification heads, LoRA adapters per
request, and gpt-oss's attention sinks through our FlashInfer backend (the opt-in
PREFILLONLY_CUDA_SINKS=1). Tiny checkpoints (float32), each check in a child process of
its own with a time limit, every number against a plain float32 transformers forward on
the same device; results.json / results.md written after each check (a check that fails or
runs out of time loses only itself).

    # here, once (needs peft): the two LoRA adapters the card cannot make
    .venv/bin/python benchmarks/gpu_checks.py --prepare build/gpu_checks
    # on the card (device run, carry ["build/gpu_kit", "build/gpu_checks"]):
    bash scripts/gpu_kit/run_on_card.sh --checks
    # or as side jobs of the engine's quick call (gpu_engine.py --parts ...,checks):
    bash scripts/gpu_kit/run_on_card.sh --engine --quick
    # rehearsed here:
    PREFILLONLY_DEVICE=cpu PYTHON=.venv/bin/python bash scripts/gpu_kit/run_on_card.sh \
        --checks --device cpu

On a card the engines run bfloat16 (FlashInfer has no float32 attention: KeyError
torch.float32, seen on the H200), held to 5e-2 of the float32 reference. FlashInfer's
smallest head_dim is 64: the tiny checkpoints' 16 stops its ragged prefill ("Invalid
configuration: NUM_MMA_D_QK=1", seen on the H200 2026-11-28).

Every check model has heads of 64 (FlashInfer's smallest): tiny.CARD_SIZES (256 wide) for
the Llama and Qwen2 ones, the gpt-oss builder's head_dim=64.

- heads: a Qwen2ForSequenceClassification (a head whose score bias SGLang invents),
  three items behind a shared query, cold and again from the cache: class probabilities;
- lora: the tiny Llama with two r=8 adapters (every projection), the base and each adapter,
  and both adapters' calls at once; the reference merges each adapter's B @ A by hand
  (peft is not on the card); the second adapter's cached tokens (none of the first's);
- sinks: the tiny gpt-oss (sliding and full layers, non-zero sinks, MoE) with
  PREFILLONLY_CUDA_SINKS=1: label probabilities cold and cached, continuation logprobs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from card_engine.report import environment  # noqa: E402
from harness.process_group import end_group, run_in_group, start_in_group  # noqa: E402

from prefillonly_sgl.verification.verify import max_abs_diff  # noqa: E402

CHECKS = ("heads", "lora", "sinks")
# float32 engine vs float32 transformers; on a card the engine runs bfloat16 (FlashInfer
# has no float32 attention) against the float32 reference: the round-3 card measured
# 1e-2 - 2.3e-2 between them on label logprobs, stock and ours alike.
TOLERANCES = {"float32": 1e-4, "bfloat16": 5e-2}
QUERY = list(range(20, 120))
ITEMS = [[130, 131, 132], [140, 141], [150]]


# ---------------------------------------------------------------- prepare (CPU, peft)


def prepare(out: Path) -> None:
    """The two adapters of the tiny Llama (seed 0, as build_tiny_model writes it)."""
    import tempfile

    from prefillonly_sgl.models.tiny import CARD_SIZES, build_tiny_model
    from prefillonly_sgl.models.tiny_adapters import build_lora_adapter

    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model(Path(tmp) / "base", "llama", **CARD_SIZES)
        for seed, name in enumerate(("a", "b")):
            build_lora_adapter(base, out / "adapters" / name, seed)
    print(f"wrote {out / 'adapters'}")


# ---------------------------------------------------------------- the checks (children)


def dtype_of(device: str) -> str:
    return "bfloat16" if device == "cuda" else "float32"


def engine_settings(device: str) -> dict:
    settings = dict(
        device=device, dtype=dtype_of(device), max_total_tokens=8192, log_level="warning"
    )
    if device == "cuda":
        settings.update(
            cuda_graph_backend_decode="disabled",
            cuda_graph_backend_prefill="disabled",  # tiny models: start fast, eager
            sampling_backend="pytorch",
        )
    return settings


def check_heads(device: str, work: Path) -> dict:
    from prefillonly_sgl import Engine
    from prefillonly_sgl.models.tiny import CARD_SIZES
    from prefillonly_sgl.models.tiny_heads import build_tiny_head
    from prefillonly_sgl.verification.reference import TransformersReference

    path = build_tiny_head(work / "head-qwen2", "qwen2", **CARD_SIZES)
    ref = TransformersReference(str(path), device=device)
    want = ref.class_scores(QUERY, ITEMS)
    out = {}
    with Engine(path, **engine_settings(device)) as engine:
        out["class_labels"] = list(engine.class_labels)
        for name in ("cold", "cached"):
            result = engine.score(QUERY, ITEMS)
            out[name] = {
                "max_diff": max_abs_diff(result.scores, want),
                "cached_tokens": result.cached_tokens,
            }
    tolerance = TOLERANCES[dtype_of(device)]
    out["ok"] = all(out[n]["max_diff"] < tolerance for n in ("cold", "cached"))
    out["ok"] = out["ok"] and out["cached"]["cached_tokens"] == 3 * len(QUERY)
    return out


def merged_reference(base: Path, adapter: Path, work: Path, device: str):
    """transformers with the adapter's B @ A * alpha / r added to each target weight."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefillonly_sgl.verification.reference import TransformersReference

    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, a in weights.items():
            if ".lora_A." not in key:
                continue
            b = weights[key.replace(".lora_A.", ".lora_B.")]
            target = key.split("base_model.model.", 1)[1].split(".lora_A.")[0] + ".weight"
            params[target] += scale * (b.float() @ a.float())
    out = work / f"merged-{adapter.name}"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return TransformersReference(str(out), device=device)


def check_lora(device: str, work: Path, adapters: Path) -> dict:
    import asyncio

    from prefillonly_sgl import Engine
    from prefillonly_sgl.models.tiny import CARD_SIZES, build_tiny_model
    from prefillonly_sgl.verification.reference import TransformersReference

    base = build_tiny_model(work / "llama", "llama", **CARD_SIZES)
    ref = TransformersReference(str(base), device=device)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    refs = {n: merged_reference(base, adapters / n, work, device) for n in ("a", "b")}
    want = {None: ref.score(QUERY, ITEMS, labels)}
    want.update({n: r.score(QUERY, ITEMS, labels) for n, r in refs.items()})
    out = {}
    settings = engine_settings(device)
    paths = [f"{n}={adapters / n}" for n in ("a", "b")]
    with Engine(
        base, enable_lora=True, lora_paths=paths, max_loras_per_batch=2, **settings
    ) as engine:
        out["lora_backend"] = engine.get_server_info().get("lora_backend")
        for name in (None, "a", "b"):
            got = engine.score(QUERY, ITEMS, labels, lora_path=name).scores
            out[f"adapter {name}"] = {"max_diff": max_abs_diff(got, want[name])}
        query = list(range(200, 290))

        async def both():
            return await asyncio.gather(
                *(engine.async_score(query, ITEMS, labels, lora_path=n) for n in ("a", "b"))
            )

        results = engine.run_until_complete(both())
        diffs = [
            max_abs_diff(r.scores, refs[n].score(query, ITEMS, labels))
            for n, r in zip(("a", "b"), results, strict=True)
        ]
        out["both at once"] = {"max_diff": max(diffs)}
        fresh = list(range(300, 390))
        engine.score(fresh, ITEMS, labels, lora_path="a")
        other = engine.score(fresh, ITEMS, labels, lora_path="b")
        out["other adapter's cached tokens"] = other.cached_tokens
    tolerance = TOLERANCES[dtype_of(device)]
    diffs_ok = all(v["max_diff"] < tolerance for v in out.values() if isinstance(v, dict))
    out["ok"] = diffs_ok and out["other adapter's cached tokens"] <= 2 * len(fresh)
    return out


def check_sinks(device: str, work: Path) -> dict:
    from prefillonly_sgl import Engine
    from prefillonly_sgl.machine.environment import CUDA_SINKS
    from prefillonly_sgl.models.tiny_family_checkpoints import build_gpt_oss
    from prefillonly_sgl.verification.reference import TransformersReference

    path = build_gpt_oss(work / "gpt_oss", 0, head_dim=64)  # FlashInfer's smallest
    ref = TransformersReference(str(path), device=device)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    query = "User profile: likes science fiction, history books and long walks.\n"
    items = ["Item: socks. Relevant?", "Item: " + "a long book about walks, " * 5 + "Relevant?"]
    want = ref.score(query, items, labels, apply_softmax=False)
    continuation = " Yes, it is relevant."
    want_cont = ref.continuation_logprobs(query, items, continuation)
    os.environ[CUDA_SINKS] = "1"
    out = {}
    with Engine(path, **engine_settings(device)) as engine:
        out["features"] = list(engine.features)
        for name in ("cold", "cached"):
            got = engine.score(query, items, labels, apply_softmax=False).scores
            out[name] = {"max_diff": max_abs_diff(got, want)}
        got = engine.continuation_logprobs(query, items, continuation).token_logprobs
        out["continuation"] = {"max_diff": max_abs_diff(got, want_cont)}
    tolerance = TOLERANCES[dtype_of(device)]
    out["ok"] = all(v["max_diff"] < tolerance for v in out.values() if isinstance(v, dict))
    return out


def run_one(name: str, args) -> dict:
    work = args.out / "work" / name
    work.mkdir(parents=True, exist_ok=True)
    if name == "heads":
        return check_heads(args.device, work)
    if name == "lora":
        return check_lora(args.device, work, args.prepared / "adapters")
    return check_sinks(args.device, work)


# ---------------------------------------------------------------- the parent


def markdown(results: dict) -> str:
    lines = [f"# Checks on {results['environment'].get('device_name', results['device'])}", ""]
    lines.append("```\n" + json.dumps(results["environment"], indent=1) + "\n```\n")
    for name in CHECKS:
        entry = results["checks"].get(name)
        if entry is None:
            continue
        verdict = "ok" if entry.get("ok") else "FAILED"
        lines.append(f"## {name}: {verdict} ({entry.get('seconds', 0):.0f} s)\n")
        lines.append("```\n" + json.dumps(entry, indent=1)[:4000] + "\n```\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_checks")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--prepared", type=Path, default=ROOT / "build" / "gpu_checks")
    parser.add_argument("--prepare", type=Path, help="write the adapters there (CPU, peft)")
    parser.add_argument("--limit", type=float, default=150, help="seconds per check")
    parser.add_argument("--deadline", type=float, default=400, help="no check starts after")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="every check's process at once (each its --limit; gpu_engine.py's side job)",
    )
    parser.add_argument("--only", help=argparse.SUPPRESS)  # a child: one check, JSON out
    args = parser.parse_args(argv)
    if args.prepare is not None:
        prepare(args.prepare)
        return 0
    names = [c for c in args.checks.split(",") if c]
    if "lora" in names and args.only is None and not (args.prepared / "adapters").exists():
        # not carried: written here where peft imports (the card's image has it)
        try:
            prepare(args.prepared)
        except Exception as e:  # the lora check then says what is missing
            print(f"no adapters at {args.prepared}: {type(e).__name__}: {e}", flush=True)
    if args.only:
        started = time.time()
        try:
            result = run_one(args.only, args)
        except Exception as e:  # the check's failure is its result
            import traceback

            result = {"ok": False, "error": "".join(traceback.format_exception(e))[-3000:]}
        result["seconds"] = round(time.time() - started, 1)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"device": args.device, "environment": environment(args.device), "checks": {}}
    started = time.time()

    def command(name: str) -> list[str]:
        return [sys.executable, __file__, "--only", name, "--device", args.device] + [
            "--out",
            str(args.out),
            "--prepared",
            str(args.prepared),
        ]

    def record(name: str, code: int | None) -> None:
        output = (args.out / f"{name}.log").read_text(errors="replace")
        lines = [x for x in output.splitlines() if x.startswith("RESULT ")]
        if lines:
            entry = json.loads(lines[-1][7:])
        elif code is None:
            entry = {"ok": False, "error": f"over {args.limit:.0f} s (killed with its engine)"}
        else:
            entry = {"ok": False, "error": f"exit {code}: {output[-3000:]}"}
        results["checks"][name] = entry
        print(f"[{time.time() - started:6.1f} s] {name}: {json.dumps(entry)[:600]}", flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "results.md").write_text(markdown(results))

    if args.parallel:
        print(f"[{time.time() - started:6.1f} s] {', '.join(names)} at once", flush=True)
        running = {}
        for name in names:
            output = (args.out / f"{name}.log").open("w")
            running[name] = (start_in_group(command(name), output, cwd=ROOT), output)
        for name, (child, output) in running.items():
            code = end_group(child, started + args.limit - time.time())
            output.close()
            record(name, code)
        return 0
    for name in names:
        if time.time() - started > args.deadline:
            results["checks"][name] = {"ok": False, "error": "not started: past the deadline"}
            continue
        print(f"[{time.time() - started:6.1f} s] {name}", flush=True)
        with (args.out / f"{name}.log").open("w") as output:
            code = run_in_group(command(name), args.limit, output, cwd=ROOT)
        record(name, code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
