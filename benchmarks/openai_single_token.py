"""Single-token OpenAI requests: ours vs stock SGLang, and vs /v1/score (issue 34).

1. Shared system prompt: N chat requests sent at once (`max_tokens=1, temperature=0,
   logprobs, top_logprobs=5`), a ~1.5k-token system prompt of instructions and labelled
   drug reviews, then one real review each as the user message; against the same N
   prompts in one `/v1/score` call (query = the rendered history, items = the rest, the
   two label tokens). Each round starts from an empty prefix cache; chat and score
   alternate. Ideal: chat costs what /v1/score costs (ratio 1.0).
2. Longest single-token chat prompt under one KV pool (`--max-total-tokens POOL`): the
   longest of the lengths tried that answers 200.

One server at a time (they share the cores); ours (`prefillonly serve`) and stock SGLang
(`python -m sglang.launch_server`, its FCFS policy) on the same model, dtype and pool.

    .venv/bin/python benchmarks/openai_single_token.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from harness.servers import Server  # noqa: E402
from harness.stats import spread  # noqa: E402

from prefillonly_sgl.data.drug_reviews import load_drug_reviews  # noqa: E402
from prefillonly_sgl.models.default_model import default_model_path  # noqa: E402

INSTRUCTIONS = (
    "You are a careful annotator of patient reviews of medicines. Read the review and "
    "answer with exactly one word: positive if the patient is satisfied with the drug, "
    "negative if not. Side effects alone do not make a review negative when the patient "
    "says the drug works. Here are labelled examples.\n\n"
)


def workload(tokenizer, n: int, system_tokens: int, review_chars: int | None = None):
    """(chats, a /v1/score body of the same prompts, the system prompt's tokens); each
    user message a whole review, or its first ``review_chars`` characters."""
    reviews = [r for r in load_drug_reviews("test") if r.sentiment in ("positive", "negative")]
    shots, parts = reviews[n:], [INSTRUCTIONS]
    for r in shots:
        if len(tokenizer.encode("".join(parts))) >= system_tokens:
            break
        parts.append(f"Review: {r.text[:600]}\nLabel: {r.sentiment}\n\n")
    system = "".join(parts)
    chats = [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Review: {r.text[:review_chars]}"},
        ]
        for r in reviews[:n]
    ]
    history = tokenizer.apply_chat_template(chats[0][:1], tokenize=False)
    rendered = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
    ]
    assert all(text.startswith(history) for text in rendered)
    labels = [tokenizer.encode(w, add_special_tokens=False)[0] for w in ("positive", "negative")]
    score_body = {
        "query": history,
        "items": [text[len(history) :] for text in rendered],
        "label_token_ids": labels,
        "apply_softmax": True,
    }
    return chats, score_body, len(tokenizer.encode(system))


async def _post(session, url, body):
    async with session.post(url, json=body) as r:
        text = await r.text()
        return r.status, text


async def chat_burst(url: str, chats) -> float:
    body = {"model": "m", "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 5}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        t0 = time.perf_counter()
        answers = await asyncio.gather(
            *(_post(s, f"{url}/v1/chat/completions", {**body, "messages": c}) for c in chats)
        )
        wall = time.perf_counter() - t0
    bad = [a for a in answers if a[0] != 200]
    if bad:
        raise RuntimeError(f"chat failed: {bad[0]}")
    return wall


async def score_call(url: str, body: dict) -> float:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        t0 = time.perf_counter()
        status, text = await _post(s, f"{url}/v1/score", body)
        wall = time.perf_counter() - t0
    if status != 200:
        raise RuntimeError(f"score failed: {status} {text[:300]}")
    return wall


async def longest_chat(url: str, tokenizer, lengths: list[int]) -> dict[int, int]:
    """Per target length, the status of one single-token chat request that long."""
    word = "The medicine helped a little but the nausea stayed. "
    per = len(tokenizer.encode(word, add_special_tokens=False))
    statuses = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        for length in lengths:
            text = word * max(1, length // per)
            messages = [{"role": "user", "content": text}]
            n = len(
                tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            )
            status, _ = await _post(
                s,
                f"{url}/v1/chat/completions",
                {"model": "m", "messages": messages, "max_tokens": 1, "temperature": 0},
            )
            statuses[n] = status
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--pool", type=int, default=16384, help="KV pool of part 1")
    parser.add_argument("--long-pool", type=int, default=2048, help="KV pool of part 2")
    parser.add_argument("--lengths", default="2000,4000,6000,8000")
    parser.add_argument("--systems", default="ours,stock-fcfs")
    parser.add_argument("--parts", default="burst,longest", help="burst, longest or both")
    parser.add_argument("--out", default=str(Path(__file__).parent / "openai_results"))
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    chats, score_body, system_len = workload(tokenizer, args.requests, args.system_tokens)
    lengths = [int(x) for x in args.lengths.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="openai-bench-"))
    results = {"settings": vars(args), "system_prompt_tokens": system_len, "systems": {}}
    print(f"[bench] {args.requests} reviews behind a {system_len}-token system prompt, "
          f"{args.dtype}, pool {args.pool}")  # fmt: skip
    parts = args.parts.split(",")
    for system in args.systems.split(","):
        row = results["systems"].setdefault(system, {})
        if "burst" in parts:
            server = Server.start(system, model, args.dtype, args.pool, logs / f"{system}.log")
            try:
                chat_s, score_s = [], []
                asyncio.run(chat_burst(server.url, chats[:2]))  # warm-up (not timed)
                for _ in range(args.rounds):
                    server.flush_cache()
                    chat_s.append(asyncio.run(chat_burst(server.url, chats)))
                    server.flush_cache()
                    score_s.append(asyncio.run(score_call(server.url, score_body)))
            finally:
                server.stop()
            ratios = [c / s for c, s in zip(chat_s, score_s)]
            row.update(chat_s=chat_s, score_s=score_s, chat_over_score=ratios)
            print(f"[bench] {system}: {args.requests} chat requests {spread(chat_s)} s, "
                  f"the same prompts in one /v1/score call {spread(score_s)} s, chat/score "
                  f"{spread(ratios, 2)}")  # fmt: skip
        if "longest" in parts:
            log = logs / f"{system}-long.log"
            server = Server.start(system, model, args.dtype, args.long_pool, log)
            try:
                statuses = asyncio.run(longest_chat(server.url, tokenizer, lengths))
            finally:
                server.stop()
            longest = max((n for n, st in statuses.items() if st == 200), default=0)
            row.update(long_pool_statuses=statuses, longest_chat_prompt=longest)
            print(f"[bench] {system}: longest single-token chat prompt under a "
                  f"{args.long_pool}-token pool: {longest} tokens (status per length: "
                  f"{statuses})")  # fmt: skip
    name = "results.json" if len(parts) > 1 else f"results-{parts[0]}.json"
    (out / name).write_text(json.dumps(results, indent=1))
    print(f"[bench] wrote {out / name}")


if __name__ == "__main__":
    main()
