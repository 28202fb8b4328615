"""Loglikelihoods for lm-evaluation-harness (issue 35): a few-shot multiple-choice task
run by lm-eval's `local-completions` model against ours, stock SGLang and ours without
the per-position cache, and by lm-eval's own `hf` backend, one after the other.

Task: evals/drug_sentiment/ (3 choices, the same few-shot examples before every
question), `--shots` examples, `--limit` questions, token-id prompts, batch size 1, one
request at a time (lm-eval's defaults). Reported per system: the task's wall time, the
share of prompt positions it computed (Prometheus prompt / cached token counters; ideal:
each distinct prefix once, the prompts' trie), and each request's loglikelihood against
the hf backend's (max difference, is_greedy agreement). Then the peak memory of one
`--echo-tokens` echo request (scheduler VmHWM above what it held before), ours vs stock.

    .venv/bin/python benchmarks/lm_eval_loglikelihood.py                 # the full run
    .venv/bin/python benchmarks/lm_eval_loglikelihood.py --smoke         # tiny, minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from harness.servers import Server  # noqa: E402

from prefillonly_sgl.models.default_model import default_model_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASK_DIR = REPO / "evals" / "drug_sentiment"
SERVED = ("ours", "stock-fcfs", "ours-no-logprob-cache")
HF = "hf"


def task_dir(tmp: Path) -> Path:
    """The task with absolute data paths (lm-eval resolves them against its cwd)."""
    out = tmp / "tasks"
    out.mkdir(exist_ok=True)
    yaml = (TASK_DIR / "drug_sentiment.yaml").read_text()
    for split in ("test", "train"):
        yaml = yaml.replace(f"evals/drug_sentiment/{split}.jsonl", str(TASK_DIR / f"{split}.jsonl"))
    (out / "drug_sentiment.yaml").write_text(yaml)
    return out


def evaluate(model, tasks: Path, args) -> tuple[float, list, dict]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    results = simple_evaluate(
        model=model, tasks=["drug_sentiment"], task_manager=TaskManager(include_path=str(tasks)),
        num_fewshot=args.shots, limit=args.limit, log_samples=True, bootstrap_iters=0,
        **({"device": "cpu"} if model == HF else {}),
        **({"model_args": f"pretrained={args.model},dtype={args.dtype},max_length="
            f"{args.max_length}"} if model == HF else {}),
    )  # fmt: skip
    seconds = time.perf_counter() - start
    samples = results["samples"]["drug_sentiment"]
    per_request = [
        (s["doc_id"], i, resp[0][0], resp[0][1], s["arguments"][i])
        for s in samples
        for i, resp in enumerate(s["resps"])
    ]
    return seconds, per_request, results["results"]["drug_sentiment"]


def api_model(url: str, args):
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        model="m", base_url=f"{url}/v1/completions", tokenizer_backend="huggingface",
        tokenizer=args.model, tokenized_requests=True, max_length=args.max_length,
    )  # fmt: skip


def trie_size(prompts: list[list[int]]) -> int:
    """Distinct prefixes of the prompts: the positions a perfect prefix cache computes."""
    seen = set()
    for ids in prompts:
        seen.update(tuple(ids[: i + 1]) for i in range(len(ids)))
    return len(seen)


def echo_peak(server: Server, tokenizer, tokens: int) -> dict:
    """Peak resident memory of the scheduler during one echo request of `tokens` tokens."""
    text = " ".join(["The patient reported mild headaches but the drug worked well."] * 1000)
    ids = tokenizer.encode(text)[:tokens]
    server.flush_cache()
    scheduler = server.scheduler()
    before = scheduler.memory_info().rss if scheduler is not None else 0
    server.reset_peak_memory()
    start = time.perf_counter()
    r = requests.post(f"{server.url}/v1/completions", json={"model": "m", "prompt": [ids],
                      "max_tokens": 1, "echo": True, "logprobs": 1}, timeout=3600)  # fmt: skip
    seconds = time.perf_counter() - start
    peak = server.peak_memory()
    entries = r.json()["choices"][0]["logprobs"]["token_logprobs"] if r.ok else []
    return {
        "tokens": len(ids), "status": r.status_code, "seconds": round(seconds, 2),
        "resident_before_mib": round(before / 2**20), "peak_mib": round(peak / 2**20),
        "above_before_mib": round((peak - before) / 2**20),
        "logprob_sum": round(sum(x for x in entries if x is not None), 4),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--shots", type=int, default=16)
    parser.add_argument("--limit", type=int, default=60, help="questions")
    parser.add_argument("--max-length", type=int, default=4096, help="lm-eval's max_length")
    parser.add_argument("--pool", type=int, default=16384, help="KV pool tokens, every server")
    parser.add_argument("--echo-tokens", type=int, default=8000)
    parser.add_argument("--systems", default=",".join((*SERVED, HF)))
    parser.add_argument("--smoke", action="store_true", help="2 shots, 3 questions, 1k echo")
    parser.add_argument("--out", default=str(Path(__file__).parent / "lm_eval_results"))
    args = parser.parse_args()
    if args.smoke:
        args.shots, args.limit, args.echo_tokens = 2, 3, 1000
    args.model = args.model or str(default_model_path())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"settings": {k: v for k, v in vars(args).items() if k != "out"}, "systems": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tasks = task_dir(Path(tmp))
        for system in args.systems.split(","):
            if system == HF:
                seconds, per_request, metrics = evaluate(HF, tasks, args)
                report["systems"][HF] = {"seconds": round(seconds, 1), "acc": metrics["acc,none"],
                                         "requests": [r[:4] for r in per_request]}  # fmt: skip
                print(f"{HF}: {seconds:.1f} s", flush=True)
                continue
            server = Server.start(system, args.model, args.dtype, args.pool,
                                  Path(tmp) / f"{system}.log")  # fmt: skip
            try:
                server.flush_cache()
                before = server.token_counters() or (0.0, 0.0)
                lm = api_model(server.url, args)
                seconds, per_request, metrics = evaluate(lm, tasks, args)
                after = server.token_counters() or (0.0, 0.0)
                prompt, cached = after[0] - before[0], after[1] - before[1]
                prompts = [lm._encode_pair(*args_)[0] + lm._encode_pair(*args_)[1]
                           for *_, args_ in per_request]  # fmt: skip
                memory = echo_peak(server, tokenizer, args.echo_tokens)
            finally:
                server.stop()
            report["systems"][system] = {
                "seconds": round(seconds, 1), "acc": metrics["acc,none"],
                "prompt_tokens": int(prompt), "computed_tokens": int(prompt - cached),
                "ideal_computed_tokens": trie_size(prompts), "echo_memory": memory,
                "requests": [r[:4] for r in per_request],  # doc, choice, ll, is_greedy
            }  # fmt: skip
            row = report["systems"][system]
            print(f"{system}: {seconds:.1f} s, computed {row['computed_tokens']} of "
                  f"{row['prompt_tokens']} prompt tokens (ideal {row['ideal_computed_tokens']}); "
                  f"echo {memory}", flush=True)  # fmt: skip
    summarize(report)
    name = "smoke.json" if args.smoke else f"run_{time.strftime('%Y%m%d_%H%M%S')}.json"
    (out / name).write_text(json.dumps(report, indent=1))
    print(f"wrote {out / name}")


def summarize(report: dict) -> None:
    systems = report["systems"]
    stock = systems.get("stock-fcfs", {}).get("seconds")
    hf = systems.get(HF)
    for name, row in systems.items():
        line = f"{name:24s} {row['seconds']:8.1f} s  acc {row['acc']:.3f}"
        if stock:
            line += f"  {row['seconds'] / stock:5.2f}x stock"
        if "computed_tokens" in row:
            share = row["computed_tokens"] / max(row["prompt_tokens"], 1)
            ideal = row["ideal_computed_tokens"] / max(row["prompt_tokens"], 1)
            line += f"  computed {share:6.1%} of positions (ideal {ideal:.1%})"
        if hf and name != HF:
            diffs = [abs(a[2] - b[2]) for a, b in zip(row["requests"], hf["requests"])]
            same = sum(a[3] == b[3] for a, b in zip(row["requests"], hf["requests"]))
            line += f"  max |ll - hf| {max(diffs):.1e}, is_greedy same {same}/{len(diffs)}"
        print(line)


if __name__ == "__main__":
    main()
