"""Scoring items about an image vs stock SGLang's image paths, side by side in one run
(issue 86).

    PYTHONPATH=. .venv/bin/python benchmarks/images.py            # CPU, float32
    PYTHONPATH=. .venv/bin/python benchmarks/images.py --quick    # a smoke run

A product photo (--image-size px square, seeded noise: a new image every round) scored
against --items candidate categories ("Category: shoes. Correct? Answer:") behind a short
instruction, labels " Yes" / " No", on a random-weight Qwen2.5-VL of --shape
(images_workload.VL_SHAPES). Two engines started at once in this process (an idle one
sleeps), ours and stock SGLang (STOCK_SGLANG, --stock-policy), taking turns:
- ours: ONE call `Engine.score(instruction, items, labels, images=[photo])` (the photo in
  the query, shared by every item, in the reusable prefix, the items packed behind it);
  then ours repeat: a second call about the same photo with the next --items categories
  (new items: the photo and the instruction from the prefix cache);
- ours text: the repeat's request without the photo (its placeholder removed), a new
  instruction (uncached): the issue's target, a repeat within 1.2x of it;
- stock score_request: SGLang's own `tokenizer_manager.score_request(query, items,
  label_token_ids, apply_softmax=True, image_data=[[photo]] * items)` with the same query
  text (the placeholder written in it: stock drops an image without one), i.e. every item
  a full prompt with its own copy of the photo;
- stock rerank: what SGLang's VL reranker does (entrypoints/openai/serving_rerank.py,
  _handle_vl_reranker_request): per document one GenerateReqInput with the photo,
  max_new_tokens 1, temperature 0, return_logprob, top_logprobs_num 50,
  logprob_start_len 0, awaited one after another as that handler does (--rerank-concurrent:
  all at once); its prompts are ours' (query + item: the reranker's own Qwen3-VL template
  needs a reranker checkpoint), its score P(Yes) / (P(Yes) + P(No)) of the first token's
  top logprobs, read with ours' labels. Its photo is another new one (the same engine
  as stock score_request: no embedding-cache or prefix hit between them), its text the
  same.
Each unit (ours + repeat, ours text, stock score_request, stock rerank) is warmed on
inputs of the same shape (--warmup passes), then --rounds rounds in a rotating order.
Times: wall seconds of the call. Agreement: ours' probabilities against stock
score_request's (same photo, same prompts) every round, max |diff| (want <= 1e-4); the
rerank path's P(Yes) against ours' once (an untimed rerank of round 0's photo).
Results: --out (images.json, images.md; images_quick.* with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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
from images_workload import (  # noqa: E402
    VL_SHAPES,
    build_vl,
    expanded_tokens,
    instruction,
    items,
    label_ids,
    photo,
    rerank_agreement,
    score_diff,
)

SPEEDUP_TARGET = 5.0  # stock / ours, each stock path, the issue's
REPEAT_TARGET = 1.2  # ours repeat / ours text, the issue's
AGREEMENT_TOLERANCE = 1e-4
RERANK_TOP_LOGPROBS = 50  # serving_rerank.py's top_logprobs_num
FULL = dict(rounds=5, shape="small")
QUICK = dict(rounds=1, shape="tiny")

OURS, REPEAT, TEXT, STOCK, RERANK = (
    "ours",
    "ours repeat",
    "ours text",
    "stock score_request",
    "stock rerank",
)


def ours(engine, query: str, prompts: list[str], labels, image: bytes | None) -> dict:
    images = None if image is None else [image]
    started = time.perf_counter()
    out = engine.score(query, prompts, labels, apply_softmax=True, images=images)
    seconds = time.perf_counter() - started
    return {
        "s": seconds,
        "prompt_tokens": out.prompt_tokens,
        "computed_tokens": out.prompt_tokens - out.cached_tokens,
        "requests": 1,
        "scores": out.scores,
    }


def stock_score(engine, query: str, prompts: list[str], labels, image: bytes) -> dict:
    """SGLang's Python score_request with the photo per item (image_data per item)."""
    tm = engine.tokenizer_manager
    call = tm.score_request(
        query=query,
        items=prompts,
        label_token_ids=labels,
        apply_softmax=True,
        image_data=[[image] for _ in prompts],
    )
    started = time.perf_counter()
    out = engine.run_until_complete(call)
    seconds = time.perf_counter() - started
    return {
        "s": seconds,
        "prompt_tokens": out.prompt_tokens,
        "computed_tokens": None,  # score_request does not report its cache hits
        "requests": 1,
        "scores": out.scores,
    }


def stock_rerank(
    engine, query: str, prompts: list[str], labels, image: bytes, concurrent: bool
) -> dict:
    """SGLang's VL reranker's requests (serving_rerank.py, _handle_vl_reranker_request):
    one generate request per document with the photo, awaited in turn."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    tm = engine.tokenizer_manager
    yes, no = labels

    def request(prompt: str) -> GenerateReqInput:
        return GenerateReqInput(
            text=query + prompt,
            image_data=[image],
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            return_logprob=True,
            top_logprobs_num=RERANK_TOP_LOGPROBS,
            logprob_start_len=0,
        )

    async def one(prompt: str) -> dict:
        return await tm.generate_request(request(prompt), None).__anext__()

    async def every() -> list[dict]:
        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]

    started = time.perf_counter()
    outs = engine.run_until_complete(every())
    seconds = time.perf_counter() - started
    meta = [o["meta_info"] for o in outs]
    scores = []
    for m in meta:
        top = {t[1]: t[0] for t in (m.get("output_top_logprobs") or [[]])[0]}
        if yes in top and no in top:
            p_yes, p_no = math.exp(top[yes]), math.exp(top[no])
            scores.append(p_yes / (p_yes + p_no))
        else:  # the handler scores it 0 (or p_yes / p_yes): not comparable
            scores.append(None)
    return {
        "s": seconds,
        "prompt_tokens": sum(m["prompt_tokens"] for m in meta),
        "computed_tokens": sum(m["prompt_tokens"] - (m.get("cached_tokens") or 0) for m in meta),
        "requests": len(prompts),
        "rerank_scores": scores,
    }


def run(args, model: str) -> dict:
    n = args.items
    with ExitStack() as stack:
        engines = {
            s: stack.enter_context(start_engine("images", s, model, args.pool, args.stock_policy))
            for s in ("ours", "stock")
        }
        tok = engines["stock"].tokenizer
        labels = label_ids(tok)
        first, again = items(n), items(n, repeat=True)

        def image(tag: str) -> bytes:
            return photo(tag, args.image_size)

        def ours_unit(tag: str) -> dict:
            query, img = instruction(tag), image(tag)
            return {
                OURS: ours(engines["ours"], query, first, labels, img),
                REPEAT: ours(engines["ours"], query, again, labels, img),
            }

        def text_unit(tag: str) -> dict:
            query = instruction(tag + "-text", image=False)
            return {TEXT: ours(engines["ours"], query, again, labels, None)}

        def stock_unit(tag: str) -> dict:
            # the same photo and prompts as ours' first call (another engine: uncached)
            row = stock_score(engines["stock"], instruction(tag), first, labels, image(tag))
            return {STOCK: row}

        def rerank_unit(tag: str) -> dict:
            row = stock_rerank(
                engines["stock"],
                instruction(tag),  # another photo: nothing shared with stock score_request
                first,
                labels,
                image(tag + "-rerank"),
                args.rerank_concurrent,
            )
            return {RERANK: row}

        units = {
            "ours + repeat": ours_unit,
            TEXT: text_unit,
            STOCK: stock_unit,
            RERANK: rerank_unit,
        }
        rows = rotating_rounds("images", units, args.rounds, args.warmup)
        # the rerank path on round 0's photo and prompts, untimed: its P(Yes) against ours'
        check = stock_rerank(engines["stock"], instruction("0"), first, labels, image("0"), False)
    image_tokens = expanded_tokens(model, image("0"))
    query_tokens = len(tok.encode(instruction("0", image=False), add_special_tokens=False))
    item_tokens = statistics.fmean(len(tok.encode(p, add_special_tokens=False)) for p in first)
    return {
        "workload": f"{n} candidate categories about one {args.image_size}x{args.image_size} "
        f"photo: the query {image_tokens} image + {query_tokens} text tokens, an item "
        f"{item_tokens:.0f} tokens on average; random-weight Qwen2.5-VL, shape {args.shape}",
        "rows": rows,
        "image_tokens": image_tokens,
        "query_text_tokens": query_tokens,
        "item_tokens_mean": item_tokens,
        "agreement": {
            STOCK: score_diff(rows[OURS], rows[STOCK]),
            RERANK: rerank_agreement(rows[OURS][0]["scores"], check["rerank_scores"]),
        },
    }


def summary(rows: list[dict]) -> dict:
    times = [r["s"] for r in rows]
    computed = [r["computed_tokens"] for r in rows]
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "spread": spread(times, 3),
        "times": times,
        "prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows),
        "computed_tokens": None if None in computed else statistics.median(computed),
        "requests": rows[0]["requests"],
    }


def markdown(results: dict) -> str:
    s = results["settings"]
    table = results["summary"]
    rerank = "concurrent" if s["rerank_concurrent"] == "True" else "one after another"
    lines = [
        f"{results['machine']}; float32, CPU; {s['rounds']} rounds after {s['warmup']} "
        f"warm-up passes, seconds median (min-max); stock: STOCK_SGLANG, "
        f"{s['stock_policy']}; rerank requests {rerank}.",
        "",
        f"{results['workload']}.",
        "",
        "| system | seconds | requests | prompt tokens | computed tokens |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in table.items():
        computed = "n/r" if row["computed_tokens"] is None else f"{row['computed_tokens']:.0f}"
        lines.append(
            f"| {name} | {row['spread']} | {row['requests']} | {row['prompt_tokens']:.0f} | "
            f"{computed} |"
        )
    notes = []
    base = table[OURS]
    for name in (STOCK, RERANK):
        ratio = table[name]["median_s"] / base["median_s"]
        best = table[name]["min_s"] / base["min_s"]
        met = "met" if ratio >= SPEEDUP_TARGET else "NOT met"
        notes.append(
            f"- {name} / ours {ratio:.2f}x (medians; {best:.2f}x of the minima); "
            f"target >= {SPEEDUP_TARGET:g}x {met}"
        )
    computed = table[STOCK]["prompt_tokens"] / base["computed_tokens"]
    notes.append(
        f"- tokens: stock computes every prompt whole ({table[STOCK]['prompt_tokens']:.0f}), "
        f"ours {base['computed_tokens']:.0f}: {computed:.2f}x fewer (the speedup if time "
        "were compute alone)"
    )
    ratio = table[REPEAT]["median_s"] / table[TEXT]["median_s"]
    best = table[REPEAT]["min_s"] / table[TEXT]["min_s"]
    met = "met" if ratio <= REPEAT_TARGET else "NOT met"
    notes.append(
        f"- ours repeat / ours text {ratio:.2f}x (medians; {best:.2f}x of the minima); "
        f"target <= {REPEAT_TARGET:g}x {met}"
    )
    a = results["agreement"][STOCK]
    if a["max_abs_diff"] is not None:
        met = "within" if a["max_abs_diff"] <= AGREEMENT_TOLERANCE else "NOT within"
        notes.append(
            f"- ours vs stock score_request: max |probability diff| {a['max_abs_diff']:.1e} "
            f"over {a['compared']} probabilities, {met} {AGREEMENT_TOLERANCE:g}"
        )
    a = results["agreement"][RERANK]
    diff = "" if a["max_abs_diff"] is None else f", max |P(Yes) diff| {a['max_abs_diff']:.1e}"
    notes.append(
        f"- ours vs stock rerank (round 0's photo): {a['compared']} of {a['of']} documents "
        f"with both labels in its top {RERANK_TOP_LOGPROBS}{diff}"
    )
    return "\n".join(lines + [""] + notes) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, help="default 5 (--quick: 1)")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes of each unit first")
    p.add_argument("--shape", choices=list(VL_SHAPES), help="default small (--quick: tiny)")
    p.add_argument("--items", type=int, default=20, help="candidates per call (at most 20)")
    p.add_argument("--image-size", type=int, default=224, help="px square (224: 64 tokens)")
    p.add_argument("--stock-policy", default="lpm", help="stock's schedule_policy")
    p.add_argument(
        "--rerank-concurrent",
        action="store_true",
        help="send the rerank path's requests at once (serving_rerank.py awaits each in turn)",
    )
    p.add_argument("--pool", type=int, default=16384, help="KV pool tokens, each engine")
    p.add_argument("--work", type=Path, default=Path("/tmp/images_bench"))
    p.add_argument("--out", type=Path, default=HERE / "images_results")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (~2 min): the sizes in brackets above, unless given",
    )
    return with_run_defaults(p.parse_args(argv), QUICK, FULL)


def main(argv=None) -> None:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    model = str(build_vl(args.shape, args.work / f"qwen2_5_vl-{args.shape}"))
    results = {
        "machine": machine_line(),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    results["settings"]["rounds"] = args.rounds
    res = run(args, model)
    results.update(res)
    order = [OURS, REPEAT, TEXT, STOCK, RERANK]
    results["summary"] = {name: summary(res["rows"][name]) for name in order}
    for rows in res["rows"].values():  # the scores are not kept
        for row in rows:
            row.pop("scores", None)
            row.pop("rerank_scores", None)
    results["machine"] += f" (at the end: {os.getloadavg()[0]:.1f})"
    report = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "images_quick" if args.quick else "images"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{name}.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
