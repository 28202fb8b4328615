"""A Kev-shaped decision request (issue 55): one state, 20 questions, each question its own
prompt behind the state, on a Kev checkpoint (pointer head) served by SGLang's own server
and by ours, first on a fresh state and then repeated, in one run.

    PYTHONPATH=. .venv/bin/python benchmarks/decision_checkpoints.py
    PYTHONPATH=. .venv/bin/python benchmarks/decision_checkpoints.py --state-tokens 1024 \\
        --questions 20 --repeats 3

The checkpoint: random weights (default init) in the shape of Qwen3.5's smallest published
text stack (benchmarks/hybrid_prefix_states.py's SHAPE: hidden 1024, 24 layers, every 4th
full attention), saved as Kev saves it (a bare Qwen3_5TextModel and head.pt:
models/decision_checkpoints.write_pointer_head), with the tests' tokenizer, bf16.

Per system and repeat: a fresh state (random words, --state-tokens tokens), its request sent
twice (first, then repeat); the latency of each, the prompt tokens and the cached ones
(SGLang's Prometheus counters, --enable-metrics on both servers), and the largest
difference between the two systems' answers. SGLang serves Kev with its prefix cache off:
every question computes the state. Ours computes it once, and keeps it for the repeat.
One server at a time; nothing else should run on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness.servers import Server  # noqa: E402
from hybrid_prefix_states import SHAPE, text_config_fields  # noqa: E402

from prefillonly_sgl.machine.ports import free_port  # noqa: E402

WORDS = "applicant job bills time loan savings house history payment account income rent".split()


def build_kev(out: Path, dtype: str) -> Path:
    import torch
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    from prefillonly_sgl.models.tiny_decision_checkpoints import (
        decision_tokenizer,
        write_pointer_head,
    )

    if (out / "head.pt").exists():
        return out
    tok = decision_tokenizer()
    config = Qwen3_5TextConfig(**text_config_fields(tok))
    torch.manual_seed(0)
    model = Qwen3_5TextModel(config).to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_pointer_head(out, SHAPE["hidden_size"], head_dim=256)
    return out


def questions(n: int) -> dict:
    """Kev-shaped questions: yes/no, choices of 3-4 options, 5-level scores."""
    out = {}
    for i in range(n):
        if i % 3 == 0:
            out[f"q{i}"] = {"type": "noul", "instructions": f"Does rule {i} hold for the case?"}
        elif i % 3 == 1:
            options = {f"class {j}": f"the case fits profile {i}.{j}" for j in range(3 + i % 2)}
            out[f"q{i}"] = {
                "type": "choice",
                "instructions": f"Which class ({i})?",
                "criteria": options,
            }
        else:
            levels = ["none", "low", "some", "high", "very high"]
            out[f"q{i}"] = {
                "type": "score",
                "instructions": f"How much risk ({i})?",
                "criteria": levels,
            }
    return out


def state_text(tokens: int, seed: int, tokenizer) -> str:
    """Random words, about `tokens` tokens long in the checkpoint's tokenizer."""
    rng = random.Random(seed)
    words = []
    while len(tokenizer.encode(" ".join(words), add_special_tokens=False)) < tokens:
        words += [rng.choice(WORDS) for _ in range(16)]
    return " ".join(words)


def command(system: str, model: Path, port: int, dtype: str, pool: int) -> list[str]:
    common = ["--model-path", str(model), "--dtype", dtype, "--port", str(port), "--host",
              "127.0.0.1", "--max-total-tokens", str(pool), "--enable-metrics",
              "--skip-server-warmup"]  # fmt: skip
    if system == "stock":
        stock = ["--device", "cpu", "--attention-backend", "torch_native",
                 "--mamba-radix-cache-strategy", "no_buffer",
                 "--disable-overlap-schedule"]  # fmt: skip
        return [sys.executable, "-m", "sglang.launch_server", *common, *stock]
    return [sys.executable, "-m", "prefillonly_sgl", "serve", *common, "--device", "cpu"]


def run_system(system: str, model: Path, args, log_dir: Path, tokenizer) -> dict:
    port = free_port()
    server = Server(
        command(system, model, port, args.dtype, args.pool), port, log_dir / f"{system}.log"
    )
    try:
        server.wait_ready()
        asked = questions(args.questions)
        warm = {"model": "x", "state": state_text(64, 999, tokenizer), "questions": asked}
        requests.post(server.url + "/v1/systemone", json=warm, timeout=3600).raise_for_status()
        rows, answers = [], []
        for repeat in range(args.repeats):
            body = {
                "model": "x",
                "state": state_text(args.state_tokens, repeat, tokenizer),
                "questions": asked,
            }
            for phase in ("first", "repeat"):
                before = server.token_counters() or (0.0, 0.0)
                start = time.perf_counter()
                response = requests.post(server.url + "/v1/systemone", json=body, timeout=3600)
                seconds = time.perf_counter() - start
                response.raise_for_status()
                after = server.token_counters() or (0.0, 0.0)
                prompt, cached = after[0] - before[0], after[1] - before[1]
                rows.append(
                    dict(repeat=repeat, phase=phase, seconds=seconds, prompt=prompt, cached=cached)
                )
                answers.append(response.json()["answers"])
                print(
                    f"{system} {repeat} {phase}: {seconds:.2f} s, "
                    f"{prompt:.0f} prompt tokens, {cached:.0f} cached",
                    flush=True,
                )
        return {"rows": rows, "answers": answers}
    finally:
        server.stop()


def max_answer_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for qid, ans in x.items():
            other = y[qid]
            values = [(ans.get("noul"), other.get("noul")), (ans.get("score"), other.get("score"))]
            values += [
                (p, other["probabilities"][k]) for k, p in ans.get("probabilities", {}).items()
            ]
            worst = max([worst, *(abs(u - v) for u, v in values if u is not None)])
    return worst


def summary(rows: list[dict], phase: str) -> dict:
    picked = [r for r in rows if r["phase"] == phase]
    seconds = [r["seconds"] for r in picked]
    return dict(
        median_s=statistics.median(seconds),
        min_s=min(seconds),
        max_s=max(seconds),
        prompt_tokens=statistics.median(r["prompt"] for r in picked),
        computed_tokens=statistics.median(r["prompt"] - r["cached"] for r in picked),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-tokens", type=int, default=1024)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--pool", type=int, default=32768)
    parser.add_argument("--work", type=Path, default=Path("/tmp/decision_checkpoints_bench"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "decision_checkpoints.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    model = build_kev(args.work / f"kev-{args.dtype}", args.dtype)
    results = {
        "machine": platform.processor() or platform.machine(),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    from prefillonly_sgl.models.tiny_decision_checkpoints import decision_tokenizer

    tokenizer = decision_tokenizer()
    for system in ("stock", "ours"):
        results[system] = run_system(system, model, args, args.work, tokenizer)
    results["max_answer_diff"] = max_answer_diff(
        results["stock"]["answers"], results["ours"]["answers"]
    )
    table = []
    for phase in ("first", "repeat"):
        stock, ours = (
            summary(results["stock"]["rows"], phase),
            summary(results["ours"]["rows"], phase),
        )
        table.append(
            dict(phase=phase, stock=stock, ours=ours, speedup=stock["median_s"] / ours["median_s"])
        )
    results["table"] = table
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {k: v for k, v in results.items() if k not in ("stock", "ours")}
            | {"rows": {s: results[s]["rows"] for s in ("stock", "ours")}},
            indent=1,
        )
    )
    print("| request | system | s median (min-max) | prompt tokens | computed tokens |")
    print("| --- | --- | ---: | ---: | ---: |")
    for row in table:
        for system in ("stock", "ours"):
            r = row[system]
            print(
                f"| {row['phase']} | {system} | {r['median_s']:.2f} "
                f"({r['min_s']:.2f}-{r['max_s']:.2f}) "
                f"| {r['prompt_tokens']:.0f} | {r['computed_tokens']:.0f} |"
            )
        print(f"| {row['phase']} | ours / stock speed | {row['speedup']:.1f}x | | |")
    print(f"max answer difference, ours vs stock: {results['max_answer_diff']:.2e}")


if __name__ == "__main__":
    main()
