"""Choice requests answered by scoring: ours vs stock SGLang decoding under its grammar
(issue 77).

N chat requests sent at once behind a shared ~1k-token system prompt (instructions and
labelled drug reviews; one real review each as the user message), temperature 0, in two
forms:
- `choice`: ["positive", "negative", "mixed feelings"] (ours: vLLM's
  `structured_outputs.choice`; stock: SGLang's `regex` alternation of the same strings);
- `json`: `response_format` json_schema {"sentiment": that enum, "side_effects": boolean}
  (both servers take it as is).
Against the same N prompts' labels in one `/v1/score_labels` call (query = the rendered
history, items = the rest; ours only: stock has no such endpoint). Each timing starts
from an empty prefix cache; every answer is checked for validity (a choice, or JSON of
the schema). One server at a time (they share the cores), the same model, dtype and pool.

    .venv/bin/python benchmarks/choice_requests.py --rounds 3
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
from openai_single_token import workload  # noqa: E402

from prefillonly_sgl.models.default_model import default_model_path  # noqa: E402

CHOICES = ["positive", "negative", "mixed feelings"]
SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"enum": CHOICES}, "side_effects": {"type": "boolean"}},
    "required": ["sentiment", "side_effects"],
}
REGEX = "(" + "|".join(CHOICES) + ")"


def chat_body(system: str, form: str, messages: list[dict]) -> dict:
    body = {"model": "m", "messages": messages, "temperature": 0}
    if form == "choice" and system == "ours":
        body["structured_outputs"] = {"choice": CHOICES}
    elif form == "choice":
        body.update(regex=REGEX, max_tokens=16)
    else:
        rf = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
        body.update(response_format=rf, max_tokens=48)
    return body


def valid(form: str, content: str) -> bool:
    if form == "choice":
        return content in CHOICES
    try:
        answer = json.loads(content)
    except (TypeError, json.JSONDecodeError):
        return False
    return (
        isinstance(answer, dict)
        and set(answer) == {"sentiment", "side_effects"}
        and answer["sentiment"] in CHOICES
        and isinstance(answer["side_effects"], bool)
    )


async def burst(url: str, path: str, bodies: list[dict]) -> tuple[float, list[dict]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:

        async def post(body):
            async with s.post(f"{url}{path}", json=body) as r:
                text = await r.text()
                if r.status != 200:
                    raise RuntimeError(f"{path}: {r.status} {text[:300]}")
                return json.loads(text)

        t0 = time.perf_counter()
        answers = await asyncio.gather(*(post(b) for b in bodies))
        return time.perf_counter() - t0, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument(
        "--review-chars", type=int, default=None, help="each review cut to this (default whole)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--pool", type=int, default=16384)
    parser.add_argument("--systems", default="ours,stock-fcfs")
    parser.add_argument("--out", default=str(Path(__file__).parent / "openai_results"))
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model = str(default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    chats, score_body, system_len = workload(
        tokenizer, args.requests, args.system_tokens, args.review_chars
    )
    labels_body = {k: score_body[k] for k in ("query", "items")} | {"labels": CHOICES}
    logs = Path(tempfile.mkdtemp(prefix="choice-bench-"))
    results = {"settings": vars(args), "system_prompt_tokens": system_len, "systems": {}}
    print(f"[bench] {args.requests} chat requests behind a {system_len}-token system prompt, "
          f"{args.dtype}")  # fmt: skip
    for system in args.systems.split(","):
        kind = "ours" if system.startswith("ours") else "stock"
        row = results["systems"].setdefault(system, {})
        server = Server.start(system, model, args.dtype, args.pool, logs / f"{system}.log")
        try:
            runs = {"choice": [], "json": [], "score_labels": []}
            bodies = {f: [chat_body(kind, f, c) for c in chats] for f in ("choice", "json")}
            for form in ("choice", "json"):  # warm every shape (not timed)
                asyncio.run(burst(server.url, "/v1/chat/completions", bodies[form][:2]))
            for _ in range(args.rounds):
                for form in ("choice", "json"):
                    server.flush_cache()
                    wall, answers = asyncio.run(
                        burst(server.url, "/v1/chat/completions", bodies[form])
                    )
                    contents = [a["choices"][0]["message"]["content"] for a in answers]
                    runs[form].append(
                        {
                            "s": wall,
                            "valid": sum(valid(form, c) for c in contents),
                            "example": contents[0],
                        }  # fmt: skip
                    )
                if kind == "ours":
                    server.flush_cache()
                    wall, _ = asyncio.run(burst(server.url, "/v1/score_labels", [labels_body]))
                    runs["score_labels"].append({"s": wall})
        finally:
            server.stop()
        row.update(runs)
        for form, timed in runs.items():
            if timed:
                seconds = [r["s"] for r in timed]
                ok = [r.get("valid") for r in timed]
                print(f"[bench] {system} {form}: {spread(seconds)} s, valid {ok} of "
                      f"{args.requests}")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "choice_requests" + (f"_{args.review_chars}chars" if args.review_chars else "")
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    print(f"[bench] wrote {out / name}.json")


if __name__ == "__main__":
    main()
