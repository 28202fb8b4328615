"""Typed decisions: 50 questions about one ~2k-token state, first request and a repeat,
through our /v1/decisions, stock SGLang's own /v1/decisions and our /v1/score with the
same prompts; then option-order debiasing's cost and effect on a position-bias probe.

    .venv/bin/python benchmarks/decisions.py                     # ~20 min, CPU, float32
    .venv/bin/python benchmarks/decisions.py --reps 1 --probe 8  # a quick look

Speed. The state: real drugs.com reviews as one patient's medication record (--state-tokens
tokens), its first token made unique per run so every first request is cold. Two question
sets, each in SGLang's /v1/decisions body (so stock SGLang answers the very same request):
  yes-no  50 yes/no questions (drugs, conditions and side effects the record may mention);
  mixed   40 yes/no, 5 choice (which condition a drug treated, 4 options), 5 score (the
          patient's satisfaction with a drug, 5 levels).
Systems, one server at a time on the same pool (--pool tokens), default model:
  stock           `python -m sglang.launch_server` (SGLang 0.5.23 as shipped, its default
                  fcfs policy): its own /v1/decisions, one whole prompt per question;
  ours            `prefillonly serve`: /v1/decisions (the same body), the state as every
                  question's reusable prefix;
  ours /v1/score  the same prompts and labels (the token ids ours reports with
                  return_prompt_token_ids) sent to /v1/score: query = the prompts' common
                  prefix, items = the rest, one request per label set, at once.
Per system and set: --reps cold states, each a first request then the same request again.
Computed tokens (prompt tokens not served from the prefix cache) from the answers' usage
(ours) or SGLang's Prometheus counters (stock); the ideal is the state once plus every
question's own tokens.

Debiasing. --probe drug reviews (test split) of the 8 most frequent conditions; per review
one choice question "Which condition is this review about?" with 4 options (its own
condition and 3 others, seeded), asked in each of the 4 rotations of the option list, in
OpenAI's /v1/decisions shape with debias none / reverse / cyclic and with calibrate. Per
mode: seconds and prompts per request; accuracy; where the chosen option was listed (the
share of picks per position; an order-blind model picks each position 1/4 of the time,
as the right answer is at each position once); and the flip rate (the share of reviews
whose answer changes with the order the options are listed in).

Results: benchmarks/decisions_results/ (decisions.json, decisions.md, decisions.png).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).parent))
from harness.servers import Server  # noqa: E402

OUT = Path(__file__).parent / "decisions_results"
SIDE_EFFECTS = ["nausea", "headaches", "weight gain", "insomnia", "anxiety", "acne",
                "dizziness", "hair loss", "fatigue", "mood swings", "cramps", "spotting",
                "dry mouth", "constipation", "rash"]  # fmt: skip
SATISFACTION = ["very unsatisfied", "unsatisfied", "neutral", "satisfied", "very satisfied"]


# -- the workload ------------------------------------------------------------------------
def patient_record(tokenizer, tokens: int, seed: int = 0):
    """A record of real reviews (train split) of about ``tokens`` tokens, and what it
    holds: the drugs and conditions it mentions."""
    from prefillonly_sgl.data.drug_reviews import load_drug_reviews

    reviews = load_drug_reviews("train")
    random.Random(seed).shuffle(reviews)
    parts, drugs, conditions, used = [], [], [], 0
    for r in reviews:
        part = f"Review of {r.drug} for {r.condition}: {r.text.strip()}\n"
        n = len(tokenizer.encode(part, add_special_tokens=False))
        if used + n > tokens:
            continue
        parts.append(part)
        drugs.append(r.drug)
        conditions.append(r.condition)
        used += n
        if used > tokens - 40:
            break
    return (
        "Medication record of one patient, in their own words:\n" + "".join(parts),
        drugs,
        conditions,
    )


def question_sets(drugs: list[str], conditions: list[str], seed: int = 0) -> dict[str, list[dict]]:
    """Both sets, as SGLang's /v1/decisions questions."""
    from prefillonly_sgl.data.drug_reviews import load_drug_reviews

    rng = random.Random(seed)
    others = sorted({r.drug for r in load_drug_reviews("test")} - set(drugs))
    other_conditions = sorted({r.condition for r in load_drug_reviews("test")} - set(conditions))
    yes_no = [f"Does the record mention the drug {d}?" for d in drugs[:10]]
    yes_no += [f"Does the record mention the drug {d}?" for d in rng.sample(others, 10)]
    yes_no += [f"Has the patient been treated for {c}?" for c in dict.fromkeys(conditions)][:8]
    yes_no += [f"Has the patient been treated for {c}?" for c in rng.sample(other_conditions, 7)]
    yes_no += [f"Does the patient report {s}?" for s in SIDE_EFFECTS]
    yes_no = yes_no[:50]
    assert len(yes_no) == 50, len(yes_no)

    def yn(i: int, text: str) -> dict:
        return {"id": f"q{i}", "type": "yes_no", "question": text}

    mixed = [yn(i, q) for i, q in enumerate(yes_no[:40])]
    pool = sorted(set(conditions) | set(other_conditions))
    for i, (drug, condition) in enumerate(list(zip(drugs, conditions))[:5]):
        wrong = rng.sample([c for c in pool if c != condition], 3)
        options = rng.sample([condition, *wrong], 4)
        mixed.append({"id": f"c{i}", "type": "choice", "question": f"What was {drug} taken for?",
                      "options": [{"name": o} for o in options]})  # fmt: skip
    for i, drug in enumerate(drugs[:5]):
        mixed.append({"id": f"s{i}", "type": "score", "levels": SATISFACTION,
                      "question": f"How satisfied was the patient with {drug}?"})  # fmt: skip
    return {"yes-no": [yn(i, q) for i, q in enumerate(yes_no)], "mixed": mixed}


# -- requests ----------------------------------------------------------------------------
def post(url: str, path: str, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    r = requests.post(url + path, json=body, timeout=3600)
    elapsed = time.perf_counter() - started
    if r.status_code != 200:
        raise RuntimeError(f"{path} {r.status_code}: {r.text[:500]}")
    return elapsed, r.json()


def score_requests(answer: dict) -> list[dict]:
    """The same prompts as /v1/score bodies: one per label set, query = the prompts'
    common prefix (the state), items = the rest."""
    prompts = [a["prompt_token_ids"] for a in answer["answers"].values()]
    k = min(len(p) for p in prompts)
    for p in prompts[1:]:
        k = min(k, next((i for i, (a, b) in enumerate(zip(prompts[0], p)) if a != b), k))
    groups: dict[tuple, list] = {}
    for a in answer["answers"].values():
        groups.setdefault(tuple(a["label_token_ids"]), []).append(a["prompt_token_ids"][k:])
    query = prompts[0][:k]
    return [{"query": query, "items": items, "label_token_ids": list(labels), "apply_softmax": True}
            for labels, items in groups.items()]  # fmt: skip


def send_scores(url: str, bodies: list[dict]) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(url, "/v1/score", b)[1], bodies))
    return time.perf_counter() - started, answers


def cold_state(record: str, system: str, rep: int, kind: str) -> str:
    # A unique first line: no earlier request shares more than the chat template's opening.
    return f"Case {kind}-{system}-{rep}-{random.randrange(10**9)}.\n{record}"


def computed(usage: dict) -> int:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return usage["prompt_tokens"] - cached


def run_stock(args, record, sets, log_dir) -> list[dict]:
    rows = []
    server = Server.start("stock-fcfs", args.model, args.dtype, args.pool, log_dir / "stock.log")
    try:
        for name, questions in sets.items():
            for rep in range(args.reps):
                body = {"input": cold_state(record, "stock", rep, name), "questions": questions}
                for attempt in ("first", "repeat"):
                    before = server.token_counters()
                    seconds, answer = post(server.url, "/v1/decisions", body)
                    after = server.token_counters()
                    tokens = (
                        (after[0] - before[0], after[1] - before[1]) if before and after else None
                    )
                    rows.append({"system": "stock /v1/decisions", "set": name, "rep": rep,
                                 "request": attempt, "seconds": seconds,
                                 "prompt_tokens": tokens and tokens[0],
                                 "computed_tokens": tokens and tokens[0] - tokens[1],
                                 "answers": answer["answers"]})  # fmt: skip
                    print(f"  stock {name} #{rep} {attempt}: {seconds:.2f} s", flush=True)
        rows.append(agreement_row(server, "stock /v1/decisions", record, sets["mixed"]))
    finally:
        server.stop()
    return rows


def agreement_row(server, system: str, record: str, questions: list[dict]) -> dict:
    """The mixed set about the record itself (no unique first line), for comparing the
    systems' answers to the same prompts."""
    _, answer = post(server.url, "/v1/decisions", {"input": record, "questions": questions})
    return {"system": system, "set": "agreement", "answers": answer["answers"]}


def run_ours(args, record, sets, log_dir) -> tuple[list[dict], dict]:
    rows, ideal = [], {}
    server = Server.start("ours", args.model, args.dtype, args.pool, log_dir / "ours.log")
    try:
        for name, questions in sets.items():
            for rep in range(args.reps):
                body = {"input": cold_state(record, "ours", rep, name), "questions": questions,
                        "return_prompt_token_ids": True}  # fmt: skip
                for attempt in ("first", "repeat"):
                    seconds, answer = post(server.url, "/v1/decisions", body)
                    rows.append({"system": "ours /v1/decisions", "set": name, "rep": rep,
                                 "request": attempt, "seconds": seconds,
                                 "prompt_tokens": answer["usage"]["prompt_tokens"],
                                 "computed_tokens": computed(answer["usage"]),
                                 "answers": answer["answers"]})  # fmt: skip
                    print(f"  ours {name} #{rep} {attempt}: {seconds:.2f} s", flush=True)
                # The same prompts through /v1/score, on a state of its own, cold: its prompt
                # ids read from ours' answer, then the prefix cache emptied.
                other = dict(body, input=cold_state(record, "score", rep, name))
                bodies = score_requests(post(server.url, "/v1/decisions", other)[1])
                server.flush_cache()
                state_tokens = len(bodies[0]["query"])
                own = sum(len(i) for b in bodies for i in b["items"])
                ideal[name] = {"state_tokens": state_tokens, "question_tokens": own}
                for attempt in ("first", "repeat"):
                    seconds, answers = send_scores(server.url, bodies)
                    usage = [a["usage"] for a in answers]
                    rows.append({"system": "ours /v1/score", "set": name, "rep": rep,
                                 "request": attempt, "seconds": seconds,
                                 "prompt_tokens": sum(u["prompt_tokens"] for u in usage),
                                 "computed_tokens": sum(computed(u) for u in usage)})  # fmt: skip
                    print(f"  ours /v1/score {name} #{rep} {attempt}: {seconds:.2f} s", flush=True)
        rows.append(agreement_row(server, "ours /v1/decisions", record, sets["mixed"]))
        probe = run_probe(args, server)
    finally:
        server.stop()
    return rows, {"ideal": ideal, "probe": probe}


# -- the debiasing probe -----------------------------------------------------------------
def probe_questions(n: int, seed: int = 0) -> list[dict]:
    from collections import Counter

    from prefillonly_sgl.data.drug_reviews import load_drug_reviews

    reviews = load_drug_reviews("test")
    top = [c for c, _ in Counter(r.condition for r in reviews).most_common(8)]
    rng = random.Random(seed)
    picked = [r for r in reviews if r.condition in top]
    rng.shuffle(picked)
    out = []
    for r in picked[:n]:
        options = [r.condition, *rng.sample([c for c in top if c != r.condition], 3)]
        rng.shuffle(options)
        out.append({"review": r.text.strip()[:700], "truth": r.condition, "options": options})
    return out


MODES = {"none": {}, "reverse": {"debias": "reverse"}, "cyclic": {"debias": "cyclic"},
         "calibrate": {"calibrate": True}}  # fmt: skip


def run_probe(args, server) -> dict:
    probe = probe_questions(args.probe)
    results = {}
    for mode, options in MODES.items():
        seconds, picks, correct, positions, flips, prompts = [], [], 0, [0] * 4, 0, []
        for case in probe:
            chosen = set()
            for r in range(4):
                order = case["options"][r:] + case["options"][:r]
                body = {"model": "default", "input": f"Review: {case['review']}", **options,
                        "questions": [{"type": "choice", "name": "condition",
                                       "instructions": "Which condition is this review about?",
                                       "choices": [{"value": o} for o in order]}]}  # fmt: skip
                s, answer = post(server.url, "/v1/decisions", body)
                if r:  # the first rotation computes the review: time the cached ones
                    seconds.append(s)
                (a,) = answer["answers"]
                prompts.append(answer["usage"]["input_tokens"])
                positions[order.index(a["choice"])] += 1
                correct += a["choice"] == case["truth"]
                chosen.add(a["choice"])
            flips += len(chosen) > 1
            picks.append(chosen)
        n = 4 * len(probe)
        results[mode] = {
            "seconds_per_request": statistics.median(seconds),
            "input_tokens_per_request": statistics.mean(prompts),
            "accuracy": correct / n,
            "position_shares": [p / n for p in positions],
            "first_position_share": positions[0] / n,
            "max_position_deviation": max(abs(p / n - 0.25) for p in positions),
            "flip_rate": flips / len(probe),
        }
        print(f"  probe {mode}: {results[mode]}", flush=True)
    return results


# -- report ------------------------------------------------------------------------------
def _kept(row: dict) -> dict:
    """A row as saved: timing rows without their answers, answers without token ids."""
    if row["set"] != "agreement":
        return {k: v for k, v in row.items() if k != "answers"}
    drop = ("prompt_token_ids", "label_token_ids")
    answers = {q: {k: v for k, v in a.items() if k not in drop} for q, a in row["answers"].items()}
    return {**row, "answers": answers}


def agreement(rows: list[dict]) -> float | None:
    """The largest difference between stock's and ours' probabilities for one option of
    one question of the same request."""
    by_system = {r["system"]: r["answers"] for r in rows if r["set"] == "agreement"}
    if len(by_system) < 2:
        return None
    stock, ours = by_system["stock /v1/decisions"], by_system["ours /v1/decisions"]
    return max(
        abs(stock[q]["probabilities"][k] - ours[q]["probabilities"][k])
        for q in stock
        for k in stock[q]["probabilities"]
    )


def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for row in rows:
        if row["set"] == "agreement":
            continue
        key = (row["set"], row["system"], row["request"])
        out.setdefault(key, []).append(row)
    table = {}
    for (name, system, request), mine in out.items():
        times = [r["seconds"] for r in mine]
        comp = [r["computed_tokens"] for r in mine if r.get("computed_tokens") is not None]
        table.setdefault(name, {}).setdefault(system, {})[request] = {
            "median": statistics.median(times), "min": min(times), "max": max(times),
            "computed_tokens": statistics.median(comp) if comp else None,
        }  # fmt: skip
    return table


def markdown(table: dict, extra: dict, args) -> str:
    lines = [f"Default model, {args.dtype}, pool {args.pool} tokens, {args.reps} cold states per "
             "cell (median, min-max seconds).", ""]  # fmt: skip
    for name, systems in table.items():
        ideal = extra["ideal"].get(name, {})
        lines += [f"**{name}** (state {ideal.get('state_tokens')} tokens, questions "
                  f"{ideal.get('question_tokens')} tokens in all; ideal computed tokens "
                  f"{(ideal.get('state_tokens') or 0) + (ideal.get('question_tokens') or 0)})", "",
                  "| system | first | repeat | computed tokens first / repeat |",
                  "| --- | --- | --- | --- |"]  # fmt: skip
        for system, cells in systems.items():
            f, r = cells["first"], cells["repeat"]
            lines.append(f"| {system} | {f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f}) | "
                         f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | "
                         f"{f['computed_tokens']} / {r['computed_tokens']} |")  # fmt: skip
        ours, stock = systems.get("ours /v1/decisions"), systems.get("stock /v1/decisions")
        score = systems.get("ours /v1/score")
        for request in ("first", "repeat"):
            parts = []
            if ours and stock:
                parts.append(
                    f"stock / ours {stock[request]['median'] / ours[request]['median']:.1f}x"
                )
            if ours and score:
                ratio = ours[request]["median"] / score[request]["median"]
                parts.append(f"ours / our /v1/score {ratio:.2f}x")
            lines.append(f"- {request}: " + ", ".join(parts))
        lines.append("")
    if extra.get("agreement") is not None:
        lines += [f"Agreement, the mixed set about the same record: the largest difference "
                  f"between stock's and ours' option probabilities {extra['agreement']:.2e}.",
                  ""]  # fmt: skip
    probe = extra.get("probe") or {}
    if probe:
        lines += ["**Debiasing** (the probe: 4 options, each review asked in the 4 rotations)",
                  "", "| mode | s / request (cached review) | input tokens / request | accuracy "
                  "| picks per listed position | flip rate |",
                  "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for mode, m in probe.items():
            shares = " / ".join(f"{s:.2f}" for s in m["position_shares"])
            lines.append(f"| {mode} | {m['seconds_per_request']:.3f} | "
                         f"{m['input_tokens_per_request']:.0f} | {m['accuracy']:.2f} | {shares} | "
                         f"{m['flip_rate']:.2f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(table: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4.2), squeeze=False)
    for ax, (name, systems) in zip(axes[0], table.items()):
        labels = list(systems)
        for j, request in enumerate(("first", "repeat")):
            values = [systems[s][request]["median"] for s in labels]
            bars = ax.bar([i + 0.38 * j for i in range(len(labels))], values, width=0.36,
                          label=f"{request} request")  # fmt: skip
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks([i + 0.19 for i in range(len(labels))], labels, fontsize=8)
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"50 questions about one state: {name}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--pool", type=int, default=32768)
    parser.add_argument("--state-tokens", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--probe", type=int, default=24, help="reviews in the debiasing probe")
    parser.add_argument("--systems", nargs="+", default=["stock", "ours"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from prefillonly_sgl.models.default_model import default_model_path

    args.model = str(args.model or default_model_path())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    record, drugs, conditions = patient_record(tokenizer, args.state_tokens)
    sets = question_sets(drugs, conditions)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, extra = [], {"ideal": {}, "probe": {}}
    if "stock" in args.systems:
        rows += run_stock(args, record, sets, args.out)
    if "ours" in args.systems:
        ours, extra = run_ours(args, record, sets, args.out)
        rows += ours
    table = summary(rows)
    extra["agreement"] = agreement(rows)
    rows = [_kept(row) for row in rows]
    (args.out / "decisions.json").write_text(json.dumps(
        {"settings": {k: str(v) for k, v in vars(args).items()}, "summary": table,
         "extra": extra, "rows": rows}, indent=1))  # fmt: skip
    report = markdown(table, extra, args)
    (args.out / "decisions.md").write_text(report)
    plot(table, args.out / "decisions.png")
    print(report)


if __name__ == "__main__":
    main()
