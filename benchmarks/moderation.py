"""Moderation by scoring vs stock SGLang decoding verdicts, side by side in one run (issue 85).

    PYTHONPATH=. .venv/bin/python benchmarks/moderation.py            # CPU, float32
    PYTHONPATH=. .venv/bin/python benchmarks/moderation.py --quick    # a smoke run

Two parts, each on two engines started at once in this process (an idle one sleeps),
taking turns on the same inputs:
- policies: --policies policies (moderation_workload.POLICIES) against one ~1k-token
  pharmacy support chat, on the default model as a policy classifier. ours: ONE call
  `Engine.moderate(chat, policies=...)` (the chat the query, every policy an item behind
  it); ours-1: the same with the first policy only (a chat of its own); stock: stock
  SGLang (STOCK_SGLANG, --stock-policy) given the very prompts ours scores (token ids of
  the policy classifier's prompt, moderation/guard_prompts.py: the classifier renders no
  chat template) as one batch of generate requests, greedy, --policy-new-tokens tokens,
  top --top-logprobs logprobs of each, as the guard cards' cookbooks read a verdict.
- conversations: --conversations one-message chats (real reviews, --chars characters)
  against Llama Guard 3's category list, on a random-weight Llama Guard 3 1B of
  --guard-shape (moderation_workload.GUARD_SHAPES). ours: one `Engine.moderate(chats)`;
  stock: every chat's prompt (the guard's chat template, as ours renders it) decoded for
  --verdict-new-tokens tokens ("unsafe\\nS1" is 4), all in one batch.
Each system is warmed on inputs of the same shape, then --rounds rounds in a rotating
order; every round's inputs are new (uncached); the category list, the same in every
prompt, stays cached for both, as it would in service. Times are wall seconds of the call.
Agreement: policies, stock's P(" Yes") / (P(" Yes") + P(" No")) at its first decoded token
(when both are in its top logprobs) against ours' P(Yes); conversations, stock's decoded
verdict (when it writes "safe" or "unsafe": random weights rarely do) against ours' argmax.
Results: --out (moderation.json, moderation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness.side_by_side import (  # noqa: E402
    machine_line,
    rotating_rounds,
    start_engine,
    with_run_defaults,
)
from harness.stats import spread  # noqa: E402
from moderation_workload import (  # noqa: E402
    GUARD_SHAPES,
    POLICIES,
    build_llama_guard,
    planned_prompts,
    policy_agreement,
    short_chats,
    support_chat,
    verdict_agreement,
)

TARGETS = {"policies": 5.0, "conversations": 3.0}  # stock / ours, the issue's
ONE_POLICY_TARGET = 1.5  # ours' 10 policies / ours' 1 policy
FULL = dict(rounds=5, conversation_tokens=1000, conversations=100, guard_shape="small")
QUICK = dict(rounds=1, conversation_tokens=300, conversations=10, guard_shape="tiny")


def ours(engine, inputs, policies=None) -> dict:
    started = time.perf_counter()
    out = engine.moderate(inputs, policies=policies)
    seconds = time.perf_counter() - started
    return {
        "s": seconds,
        "prompt_tokens": out.prompt_tokens,
        "computed_tokens": out.prompt_tokens - out.cached_tokens,
        "answers": [{"categories": r.categories, "verdicts": r.verdicts} for r in out.results],
    }


def stock(engine, prompts: list[list[int]], new_tokens: int, top: int) -> dict:
    """The prompts as one batch of greedy generate requests (SGLang's own Engine under
    ours: `_sgl`), each read as a cookbook does: its text and its first token's top
    logprobs."""
    params = {"max_new_tokens": new_tokens, "temperature": 0.0}
    started = time.perf_counter()
    outs = engine._sgl.generate(
        input_ids=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=top
    )
    seconds = time.perf_counter() - started
    meta = [o["meta_info"] for o in outs]
    return {
        "s": seconds,
        "prompt_tokens": sum(m["prompt_tokens"] for m in meta),
        "computed_tokens": sum(m["prompt_tokens"] - (m.get("cached_tokens") or 0) for m in meta),
        "output_tokens": sum(m["completion_tokens"] for m in meta),
        "texts": [o["text"] for o in outs],
        "first_top": [{t[1]: t[0] for t in m["output_top_logprobs"][0]} for m in meta],
    }


def _as_units(turns: dict) -> dict:
    """Each turn (a function of the round's tag returning its row) as a unit of
    harness.side_by_side.rotating_rounds: its row under its own name."""
    return {name: (lambda t, turn=turn, name=name: {name: turn(t)}) for name, turn in turns.items()}


def part_policies(args, model: str) -> dict:
    policies = POLICIES[: args.policies]
    with ExitStack() as stack:
        engines = {
            s: stack.enter_context(
                start_engine("moderation", s, model, args.pool, args.stock_policy)
            )
            for s in ("ours", "stock")
        }
        tok = engines["stock"].tokenizer

        def chat(tag: str):
            return support_chat(tok, args.conversation_tokens, tag)

        def stock_turn(tag: str) -> dict:
            prompts, _ = planned_prompts(tok, [chat(tag)], policies)
            return stock(engines["stock"], prompts, args.policy_new_tokens, args.top_logprobs)

        turns = {
            f"ours {len(policies)} policies": lambda t: ours(engines["ours"], [chat(t)], policies),
            "ours 1 policy": lambda t: ours(engines["ours"], [chat(t + "-one")], policies[:1]),
            f"stock {len(policies)} policies": stock_turn,
        }
        rows = rotating_rounds("moderation", _as_units(turns), args.rounds, warmup=1)
    from prefillonly_sgl.moderation.guard_prompts import conversation_text

    chat_tokens = len(tok.encode(conversation_text(chat("0"))))
    _, labels = planned_prompts(tok, [chat("0")], policies)
    names = list(turns)
    return {
        "workload": f"{len(policies)} policies against one {chat_tokens}-token chat, policy "
        f"classifier {Path(model).name}",
        "rows": rows,
        "conversation_tokens": chat_tokens,
        "agreement": policy_agreement(rows[names[0]], rows[names[2]], labels),
    }


def part_conversations(args) -> dict:
    folder = build_llama_guard(args.guard_shape, args.work / f"llama-guard-{args.guard_shape}")
    with ExitStack() as stack:
        engines = {
            s: stack.enter_context(
                start_engine("moderation", s, str(folder), args.pool, args.stock_policy)
            )
            for s in ("ours", "stock")
        }
        tok = engines["stock"].tokenizer

        def chats(tag: str):
            return short_chats(args.conversations, args.chars, tag)

        def stock_turn(tag: str) -> dict:
            prompts, _ = planned_prompts(tok, chats(tag))
            return stock(engines["stock"], prompts, args.verdict_new_tokens, args.top_logprobs)

        turns = {"ours": lambda t: ours(engines["ours"], chats(t)), "stock": stock_turn}
        rows = rotating_rounds("moderation", _as_units(turns), args.rounds, warmup=1)
        prompts, _ = planned_prompts(tok, chats("0"))
    mean = statistics.fmean(map(len, prompts))
    return {
        "workload": f"{args.conversations} one-message chats (prompts {mean:.0f} tokens on "
        f"average) against Llama Guard 3 1B's categories, random weights, shape "
        f"{args.guard_shape}",
        "rows": rows,
        "prompt_tokens_mean": mean,
        "agreement": verdict_agreement(rows["ours"], rows["stock"]),
    }


def summary(rows: list[dict]) -> dict:
    times = [r["s"] for r in rows]
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "spread": spread(times),
        "times": times,
        "prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows),
        "computed_tokens": statistics.median(r["computed_tokens"] for r in rows),
        "output_tokens": statistics.median(r.get("output_tokens", 0) for r in rows),
    }


def markdown(results: dict) -> str:
    s = results["settings"]
    lines = [
        f"{results['machine']}; float32, CPU; {s['rounds']} rounds after a warm-up, "
        f"seconds median (min-max); stock: STOCK_SGLANG, {s['stock_policy']}.",
        "",
        "| part | system | seconds | prompt tokens | computed tokens | decoded tokens |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for part, res in results["parts"].items():
        table = res["summary"]
        for name, row in table.items():
            lines.append(
                f"| {part} | {name} | {row['spread']} | {row['prompt_tokens']:.0f} | "
                f"{row['computed_tokens']:.0f} | {row['output_tokens']:.0f} |"
            )
        names = list(table)
        ours_row, stock_row = table[names[0]], table[names[-1]]
        ratio = stock_row["median_s"] / ours_row["median_s"]
        best = stock_row["min_s"] / ours_row["min_s"]
        met = "met" if ratio >= TARGETS[part] else "NOT met"
        notes.append(f"- {part}: {res['workload']}")
        notes.append(
            f"- {part}: stock / ours {ratio:.2f}x (medians; {best:.2f}x of the minima); "
            f"target >= {TARGETS[part]:g}x {met}"
        )
        if part == "policies":
            one = ours_row["median_s"] / table[names[1]]["median_s"]
            met = "met" if one <= ONE_POLICY_TARGET else "NOT met"
            notes.append(
                f"- policies: ours {names[0].split(' ', 1)[1]} / ours 1 policy "
                f"{one:.2f}x; target <= {ONE_POLICY_TARGET:g}x {met}"
            )
        a = res["agreement"]
        diff = (
            f", max |P(Yes) diff| {a['max_abs_diff']:.1e}"
            if a.get("max_abs_diff") is not None
            else ""
        )
        notes.append(
            f"- {part} agreement: {a['agree']} of {a['compared']} compared agree "
            f"(of {a['of']}){diff}"
        )
    return "\n".join(lines + [""] + notes) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--parts",
        nargs="+",
        default=["policies", "conversations"],
        choices=["policies", "conversations"],
    )
    p.add_argument("--rounds", type=int, help="default 5 (--quick: 1)")
    p.add_argument("--policies", type=int, default=10)
    p.add_argument("--conversation-tokens", type=int, help="default 1000 (--quick: 300)")
    p.add_argument("--policy-model", default=None, help="default: the embedded default model")
    p.add_argument("--policy-new-tokens", type=int, default=3)
    p.add_argument("--conversations", type=int, help="default 100 (--quick: 10)")
    p.add_argument("--chars", type=int, default=240, help="each short chat's review, cut")
    p.add_argument(
        "--guard-shape", choices=list(GUARD_SHAPES), help="default small (--quick: tiny)"
    )
    p.add_argument("--verdict-new-tokens", type=int, default=5)
    p.add_argument("--top-logprobs", type=int, default=20)
    p.add_argument("--stock-policy", default="lpm", help="stock's schedule_policy")
    p.add_argument("--pool", type=int, default=32768, help="KV pool tokens, each engine")
    p.add_argument("--work", type=Path, default=Path("/tmp/moderation_bench"))
    p.add_argument("--out", type=Path, default=HERE / "moderation_results")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (~2-3 min): the sizes in brackets above, unless given",
    )
    return with_run_defaults(p.parse_args(argv), QUICK, FULL)


def main(argv=None) -> None:
    args = parse_args(argv)
    from prefillonly_sgl.models.default_model import default_model_path

    args.work.mkdir(parents=True, exist_ok=True)
    model = str(args.policy_model or default_model_path())
    results = {
        "machine": machine_line(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "parts": {},
    }
    results["settings"]["rounds"] = args.rounds
    for part in args.parts:
        print(f"[moderation] part {part}", flush=True)
        res = part_policies(args, model) if part == "policies" else part_conversations(args)
        res["summary"] = {name: summary(rows) for name, rows in res["rows"].items()}
        for rows in res["rows"].values():  # answers and texts are not kept
            for row in rows:
                for key in ("answers", "texts", "first_top"):
                    row.pop(key, None)
        results["parts"][part] = res
    results["machine"] += f" (at the end: {os.getloadavg()[0]:.1f})"
    report = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "moderation_quick" if args.quick else "moderation"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{name}.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
