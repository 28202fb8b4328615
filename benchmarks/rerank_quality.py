"""Reranking on a general model: query likelihood's retrieval quality and cost per document.

Retrieval quality of query likelihood against the yes/no judge on real text, and what
query likelihood costs per document, one prefill against a one-request-per-token chain.

Quality. Queries: the --queries most frequent conditions of the drug reviews (train and
test, 979 drugs.com reviews), the condition's name as the query ("Birth Control"; names
the dataset cut short are mended: "Bipolar Disorde" -> "Bipolar Disorder"). Per query a
pool of --relevant reviews of that condition and --negatives reviews of unrelated
conditions, drawn and shuffled with --seed, each cut to its first --doc-tokens tokens.
Relevance is binary: the review's condition is the query's. Reviews of a related condition
(sharing a content word, "Pain" / "Chronic Pain", or in RELATED_GROUPS, "Birth Control" /
"Emergency Contraception") are neither relevant nor drawn as negatives. Systems, the DSL's
rankers on one Engine (default: the embedded SmolLM2-135M-Instruct, float32, CPU):

  query_likelihood   built-in (apis/rerankers.py): the query's mean log-probability per
                     token after "Please write a question based on this passage.\\n
                     Passage: {doc}\\nQuestion:" (instruction first: the shared prefix)
  ql_document_first  the same in Sachan et al.'s order: the passage, then the instruction
  qwen3_reranker     built-in: Qwen3-Reranker's yes/no judge prompt, P(yes) over yes/no
  lexical            no model: log(1 + matches) of each query word (first 5 letters)
  random             no model: the expected metrics of a random order (200 shuffles)

Metrics: nDCG@10 and MRR per query; mean over queries with a bootstrap 95% interval, and
the paired difference to query_likelihood with its own interval.

Cost. Each query form in --cost-templates (the bare condition; a question about it) on
the pools of the first --cost-queries queries, the query_likelihood prompt: ours,
Engine.continuation_logprobs (one call per query: one prefill per document, the query's
tokens read off it), against the same quantity as a chain of requests, Engine.score with
the query's token ids as ONE multi-token label, apply_softmax=False (the label's
probability: the product of its tokens' probabilities; the prompt computed once, then one
prompt per further label token, each a prefix-cache hit; every document's call sent at
once). Both on the same token ids; each document's log-probability per token (the
ranker's mean) must agree within --tolerance. Prefix cache flushed before every timed
call; --repeats rounds, the systems' order alternating. Reported: seconds per document
(median, min-max), SGLang prompts and requests per document and prompt tokens computed
(not cached) per document.

    .venv/bin/python benchmarks/rerank_quality.py            # the full run
    .venv/bin/python benchmarks/rerank_quality.py --smoke    # 3 queries x 6 documents

Results: benchmarks/rerank_results/ (summary.md, results.json, rerank_quality.png);
--smoke writes to benchmarks/results/rerank_quality_smoke/ (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness.rerank_metrics import (  # noqa: E402
    paired_difference,
    ranking_metrics,
    summarize,
)

import prefillonly_sgl as prefillonly  # noqa: E402
from prefillonly_sgl.apis.rerankers import query_likelihood, qwen3_reranker  # noqa: E402

OUT = ROOT / "benchmarks" / "rerank_results"
SMOKE_OUT = ROOT / "benchmarks" / "results" / "rerank_quality_smoke"
BASE = "query_likelihood"
MODEL_SYSTEMS = ("query_likelihood", "ql_document_first", "qwen3_reranker")
SYSTEMS = (*MODEL_SYSTEMS, "lexical", "random")
TEMPLATES = ("{condition}", "Which medication works best for {condition}?")
RANDOM_SHUFFLES = 200
FULL = {"queries": 18, "min_relevant": 5, "relevant": 5, "negatives": 25, "doc_tokens": 128,
        "bootstrap": 2000, "cost_queries": 3, "repeats": 3}  # fmt: skip
SMOKE = {"queries": 3, "relevant": 2, "negatives": 4, "doc_tokens": 64, "bootstrap": 200,
         "cost_queries": 1, "repeats": 1}  # fmt: skip


@prefillonly.ranker(method="likelihood", item="document")
def ql_document_first(query: str, document: str) -> prefillonly.Prompt:
    """Query likelihood in Sachan et al.'s order: the passage first, then the instruction."""
    return prefillonly.Prompt(
        prefix="",
        item=f"Passage: {document}\nPlease write a question based on this passage.\nQuestion:",
        continuation=f" {query}",
    )


RANKERS = {
    "query_likelihood": query_likelihood,
    "ql_document_first": ql_document_first,
    "qwen3_reranker": qwen3_reranker,
}

# -- data -------------------------------------------------------------------------------

# The dataset drops a condition's last letter ("Disorde") or first ("ibromyalgia").
CUT_ENDINGS = {
    "Disorde": "Disorder",
    "Cance": "Cancer",
    "Ulce": "Ulcer",
    "Bladde": "Bladder",
    "Othe": "Other",
    "Feve": "Fever",
    "Trem": "Tremor",
    "Lab": "Labor",
}
CUT_NAMES = {"ibromyalgia": "Fibromyalgia", "atigue": "Fatigue"}
# Conditions that name the same thing with no word in common.
RELATED_GROUPS = (
    {"Birth Control", "Emergency Contraception"},
    {"Obesity", "Weight Loss"},
    {"Depression", "Major Depressive Disorder"},
    {"Migraine", "Migraine Prevention", "Headache"},
)
GENERIC_WORDS = {
    "and",
    "of",
    "or",
    "the",
    "in",
    "after",
    "disorder",
    "syndrome",
    "disease",
    "infection",
    "acute",
    "chronic",
    "maintenance",
    "prevention",
    "type",
    "male",
    "active",
}


def mended(condition: str) -> str:
    """The condition's full name (the dataset cuts some short)."""
    condition = CUT_NAMES.get(condition, condition)
    for cut, full in CUT_ENDINGS.items():
        if condition.endswith(cut):
            return condition[: -len(cut)] + full
    return condition


def usable(name: str) -> bool:
    """A real condition (not empty, not a scraped fragment like '3</span> users found...')."""
    return (
        bool(name) and name[0].isupper() and not set(name) & set("<>)") and "Not Listed" not in name
    )


def content_words(name: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", name.lower())) - GENERIC_WORDS


def related(a: str, b: str) -> bool:
    """Same or related conditions (mended names)."""
    if a == b or content_words(a) & content_words(b):
        return True
    return any(a in group and b in group for group in RELATED_GROUPS)


@dataclass(frozen=True)
class Pool:
    query: str  # the condition's mended name
    condition: str  # as in the dataset: what relevance compares
    documents: list[str]  # cut to the token budget
    review_ids: list[int]  # rows of train + test
    relevant: list[bool]


def build_pools(tokenizer, args) -> list[Pool]:
    from prefillonly_sgl.apis.truncation import cut
    from prefillonly_sgl.data.drug_reviews import load_drug_reviews

    reviews, seen = [], set()
    for review in load_drug_reviews("train") + load_drug_reviews("test"):
        if review.text not in seen:  # the same text twice would be its own near-duplicate
            seen.add(review.text)
            reviews.append(review)
    names = {r.condition: mended(r.condition) for r in reviews}
    by_condition: dict[str, list[int]] = defaultdict(list)
    for i, review in enumerate(reviews):
        if usable(names[review.condition]):
            by_condition[review.condition].append(i)
    counts = Counter(
        {c: len(ids) for c, ids in by_condition.items() if len(ids) >= args.min_relevant}
    )
    chosen = [c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][: args.queries]
    pools = []
    for condition in chosen:
        rng = random.Random(f"{args.seed}:{condition}")
        mine = by_condition[condition]
        positives = rng.sample(mine, min(args.relevant, len(mine)))
        others = [
            i
            for c, ids in by_condition.items()
            if not related(names[c], names[condition])
            for i in ids
        ]
        negatives = rng.sample(sorted(others), min(args.negatives, len(others)))
        ids = positives + negatives
        rng.shuffle(ids)
        pools.append(
            Pool(
                query=names[condition],
                condition=condition,
                documents=[cut(tokenizer, reviews[i].text, args.doc_tokens) for i in ids],
                review_ids=ids,
                relevant=[reviews[i].condition == condition for i in ids],
            )
        )
    return pools


# -- quality ----------------------------------------------------------------------------


def lexical_scores(query: str, documents: list[str]) -> list[float]:
    """Sum over the query's words of log(1 + how often a document word starts like it
    (first 5 letters)): a crude lexical match, no model."""
    words = [w[:5] for w in re.findall(r"[a-z0-9]+", query.lower())]
    scores = []
    for document in documents:
        stems = Counter(w[:5] for w in re.findall(r"[a-z0-9]+", document.lower()))
        scores.append(math.fsum(math.log1p(stems[w]) for w in words))
    return scores


def random_metrics(pool: Pool, k: int, seed: int) -> dict[str, float]:
    """The mean metrics over RANDOM_SHUFFLES random orders of the pool."""
    rng = random.Random(f"{seed}:random:{pool.condition}")
    rows = []
    for _ in range(RANDOM_SHUFFLES):
        scores = [rng.random() for _ in pool.documents]
        rows.append(ranking_metrics(scores, pool.relevant, k))
    return {m: statistics.fmean(r[m] for r in rows) for m in ("ndcg", "mrr")}


def quality(engine, pools: list[Pool], systems: list[str], args) -> dict:
    """Per system: per-query scores and metrics, seconds; then the summaries."""
    for system in systems:  # untimed: an engine's first calls pay for its set-up
        if system in RANKERS:
            RANKERS[system](pools[0].query, items=pools[0].documents[:2], engine=engine)
    out = {}
    for system in systems:
        per_query, started = [], time.perf_counter()
        for pool in pools:
            if system == "random":
                scores, metrics = None, random_metrics(pool, args.k, args.seed)
            else:
                if system == "lexical":
                    scores = lexical_scores(pool.query, pool.documents)
                else:
                    ranking = RANKERS[system](pool.query, items=pool.documents, engine=engine)
                    scores = [item.score for item in ranking.by_input]
                metrics = ranking_metrics(scores, pool.relevant, args.k)
            per_query.append({"query": pool.query, "scores": scores, **metrics})
        seconds = time.perf_counter() - started
        documents = sum(len(p.documents) for p in pools)
        out[system] = {
            "seconds": seconds,
            "seconds_per_document": seconds / documents,
            "per_query": per_query,
            **{
                m: summarize([r[m] for r in per_query], args.bootstrap, args.seed)
                for m in ("ndcg", "mrr")
            },
        }
        print(
            f"[quality] {system:18s} nDCG@{args.k} {out[system]['ndcg']['mean']:.3f}  "
            f"MRR {out[system]['mrr']['mean']:.3f}  ({seconds:.1f} s)",
            flush=True,
        )
    if BASE in out:
        for system, row in out.items():
            if system != BASE:
                row["vs_" + BASE] = {
                    m: paired_difference(
                        [r[m] for r in row["per_query"]],
                        [r[m] for r in out[BASE]["per_query"]],
                        args.bootstrap,
                        args.seed,
                    )
                    for m in ("ndcg", "mrr")
                }
    return out


# -- cost -------------------------------------------------------------------------------


class Counted:
    """Counts the SGLang requests and prompts of the engine calls made inside it (the
    engine's own usage records: prefillonly_sgl/scoring/usage.py)."""

    def __enter__(self):
        from prefillonly_sgl.scoring.call_context import carrying, current
        from prefillonly_sgl.scoring.usage import RequestRecord

        self.record = RequestRecord("rerank_quality")
        # engine calls made inside start from this context: their records are children
        self._carrying = carrying(current().replace(record=self.record))
        self._carrying.__enter__()
        return self

    def __exit__(self, *exc):
        self._carrying.__exit__(*exc)

    def counts(self) -> dict[str, int]:
        usage = self.record.usage
        return {
            "sglang_requests": len(self.record.sglang_requests),
            "prompts": usage.prompts,
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
        }


def engine_processes() -> list:
    """This process (the engine's tokenizer manager) and its children (SGLang's scheduler
    and detokenizer): their CPU seconds are the work, less sensitive to other load than
    wall time."""
    import psutil

    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def cpu_seconds(processes) -> float:
    import psutil

    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def flush(engine) -> bool:
    """Empty the prefix cache (SGLang's Engine.flush_cache) so no call reuses another's."""
    result = engine._sgl.flush_cache()
    return bool(getattr(result, "success", True))


def run_ours(engine, cases) -> tuple[list[float], dict]:
    """One continuation_logprobs call per query (its documents together)."""
    sums = []
    with Counted() as counted:
        for case in cases:
            result = engine.continuation_logprobs(
                case["prefix"], case["items"], case["continuation"]
            )
            sums.extend(result.sums)
    return sums, counted.counts()


def run_chain(engine, cases) -> tuple[list[float], dict]:
    """Per query, every document's Engine.score call at once: the prompt's token ids, the
    continuation's ids as one label, its probability over the whole vocabulary."""

    async def one_query(case):
        calls = [
            engine.async_score(
                ids[:-1], [[ids[-1]]], [case["continuation_ids"]], apply_softmax=False
            )
            for ids in case["prompt_ids"]
        ]
        return await asyncio.gather(*calls)

    sums = []
    with Counted() as counted:
        for case in cases:
            for result in engine.run_until_complete(one_query(case)):
                p = result.scores[0][0]
                sums.append(math.log(p) if p > 0 else -math.inf)
    return sums, counted.counts()


def cost_cases(tokenizer, pools: list[Pool], template: str) -> list[dict]:
    """The query_likelihood prompts of each pool, as text (ours) and as the same token ids
    (the chain): prompt = prefix + item tokenized whole with special tokens, the
    continuation on its own without (plan_continuations' rule)."""
    cases = []
    for pool in pools:
        query = template.format(condition=pool.query)
        prompts = [query_likelihood.fn(query, document) for document in pool.documents]
        prefix, continuation = prompts[0].prefix, prompts[0].continuation
        cases.append(
            {
                "query": query,
                "prefix": prefix,
                "continuation": continuation,
                "items": [p.item for p in prompts],
                "prompt_ids": [list(tokenizer.encode(prefix + p.item)) for p in prompts],
                "continuation_ids": list(tokenizer.encode(continuation, add_special_tokens=False)),
            }
        )
    return cases


def cost(engine, pools: list[Pool], args) -> list[dict]:
    rows, processes = [], engine_processes()
    runners = {"ours": run_ours, "chain": run_chain}
    for template in args.cost_templates:
        cases = cost_cases(engine.tokenizer, pools[: args.cost_queries], template)
        documents = sum(len(c["items"]) for c in cases)
        warm = [dict(c, items=c["items"][:1], prompt_ids=c["prompt_ids"][:1]) for c in cases[:1]]
        for run in runners.values():  # untimed: the first call of a shape pays for set-up
            run(engine, warm)
        seconds = {name: [] for name in runners}
        cpu = {name: [] for name in runners}
        sums, counts, flushed, diffs = {}, {}, True, []
        for r in range(args.repeats):
            order = list(runners) if r % 2 == 0 else list(runners)[::-1]
            for name in order:
                flushed &= flush(engine)
                cpu_start, started = cpu_seconds(processes), time.perf_counter()
                sums[name], counts[name] = runners[name](engine, cases)
                seconds[name].append((time.perf_counter() - started) / documents)
                cpu[name].append((cpu_seconds(processes) - cpu_start) / documents)
                print(f"[cost]   repeat {r + 1} {name}: {seconds[name][-1] * 1e3:.1f} ms/doc "
                      f"(CPU {cpu[name][-1] * 1e3:.1f} ms/doc)", flush=True)  # fmt: skip
            # Per token (the mean the ranker sorts by): float32 rounding of two paths adds
            # up over a continuation's tokens, so a sum's gap grows with its length.
            lengths = [len(c["continuation_ids"]) for c in cases for _ in c["items"]]
            diffs += [
                abs(a - b) / n for a, b, n in zip(sums["ours"], sums["chain"], lengths, strict=True)
            ]
        row = {
            "template": template,
            "queries": [c["query"] for c in cases],
            "documents": documents,
            "continuation_tokens": statistics.fmean(len(c["continuation_ids"]) for c in cases),
            "prompt_tokens_mean": statistics.fmean(
                len(ids) for c in cases for ids in c["prompt_ids"]
            ),
            "max_abs_logprob_diff": max(diffs),
            "agree": max(diffs) <= args.tolerance,
            "cache_flushed": flushed,
            "logprob_sums": {n: s for n, s in sums.items()},
            "systems": {},
        }
        for name in runners:
            s, c = seconds[name], counts[name]
            row["systems"][name] = {
                "seconds_per_document": s,
                "median": statistics.median(s),
                "min": min(s),
                "max": max(s),
                "cpu_seconds_per_document": cpu[name],
                "cpu_median": statistics.median(cpu[name]),
                "counts_last_repeat": c,
                "sglang_requests_per_document": c["sglang_requests"] / documents,
                "prompts_per_document": c["prompts"] / documents,
                "computed_tokens_per_document": (c["prompt_tokens"] - c["cached_tokens"])
                / documents,
            }
        rows.append(row)
        ours, chain = row["systems"]["ours"]["median"], row["systems"]["chain"]["median"]
        print(
            f"[cost] {template!r}: ours {ours * 1e3:.1f} ms/doc, chain {chain * 1e3:.1f} ms/doc "
            f"({chain / ours:.2f}x); max |diff| {row['max_abs_logprob_diff']:.2e}",
            flush=True,
        )
    return rows


# -- report -----------------------------------------------------------------------------


def machine() -> dict:
    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        mem = next(
            line
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        mem_gib = round(int(mem.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        mem_gib = None
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": commit,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _ci(s: dict) -> str:
    return f"{s['mean']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"


def _diff(d: dict | None) -> str:
    return "-" if d is None else f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def markdown(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    pools = report["pools"]
    lines = [
        f"Machine: {m['processor'] or m['machine']}, {m['cores']} cores, {m['memory_gib']} GiB, "
        f"torch {m['torch']} ({m['torch_threads']} threads), load {m['load_average']}, "
        f"{m['utc']} UTC, commit {m['commit']}. "
        f"Model {s['model_name']}, {s['dtype']}, {s['device']}.",
        "",
        f"Quality: {len(pools)} queries (drug-review conditions), pools of "
        f"{statistics.fmean(len(p['review_ids']) for p in pools):.0f} reviews "
        f"({statistics.fmean(sum(p['relevant']) for p in pools):.1f} relevant), each cut to "
        f"{s['doc_tokens']} tokens. Mean over queries [bootstrap 95% interval]; difference "
        f"to {BASE}: paired, per query.",
        "",
        f"| system | nDCG@{s['k']} | MRR | nDCG@{s['k']} - {BASE} | MRR - {BASE} | s/document |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in report["quality"].items():
        vs = row.get("vs_" + BASE, {})
        lines.append(
            f"| {name} | {_ci(row['ndcg'])} | {_ci(row['mrr'])} | {_diff(vs.get('ndcg'))} "
            f"| {_diff(vs.get('mrr'))} | {row['seconds_per_document']:.3f} |"
        )
    if report["cost"]:
        lines += [
            "",
            f"Cost of query likelihood: the query_likelihood prompt on the pools of "
            f"{report['cost'][0]['queries']} ({report['cost'][0]['documents']} documents), "
            f"{s['repeats']} repeats (median, min-max), prefix cache flushed before each. ours: "
            f"Engine.continuation_logprobs; chain: Engine.score with the query as one "
            f"multi-token label. Per document: wall ms, CPU ms of this process and the "
            f"engine's (scheduler, detokenizer), SGLang requests and prompts, prompt tokens "
            f"computed (not cached).",
            "",
            "| query form | query tokens | prompt tokens | system | wall ms | CPU ms | requests "
            "| prompts | computed tokens | chain / ours (wall, CPU) | max abs diff per token |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in report["cost"]:
            ours = row["systems"]["ours"]
            for name, c in row["systems"].items():
                ratio = check = ""
                if name != "ours":
                    ratio = f"{c['median'] / ours['median']:.2f}x, "
                    ratio += f"{c['cpu_median'] / ours['cpu_median']:.2f}x"
                    verdict = "ok" if row["agree"] else "OVER"
                    check = f"{row['max_abs_logprob_diff']:.1e} ({verdict} {s['tolerance']:g})"
                lines.append(
                    f"| {row['template']} | {row['continuation_tokens']:.1f} | "
                    f"{row['prompt_tokens_mean']:.0f} | {name} | {c['median'] * 1e3:.1f} "
                    f"({c['min'] * 1e3:.1f}-{c['max'] * 1e3:.1f}) | {c['cpu_median'] * 1e3:.1f} | "
                    f"{c['sglang_requests_per_document']:.2f} | {c['prompts_per_document']:.2f} | "
                    f"{c['computed_tokens_per_document']:.1f} | {ratio} | {check} |"
                )
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality_rows, cost_rows = report["quality"], report["cost"]
    fig, axes = plt.subplots(
        1, 2 if cost_rows else 1, figsize=(12 if cost_rows else 7, 4.2), squeeze=False
    )
    ax = axes[0][0]
    names, width = list(quality_rows), 0.38
    k = report["settings"]["k"]
    for j, (metric, label) in enumerate((("ndcg", f"nDCG@{k}"), ("mrr", "MRR"))):
        means = [quality_rows[n][metric]["mean"] for n in names]
        err = [
            [m - quality_rows[n][metric]["ci_low"] for n, m in zip(names, means)],
            [quality_rows[n][metric]["ci_high"] - m for n, m in zip(names, means)],
        ]
        xs = [i + (j - 0.5) * width for i in range(len(names))]
        ax.bar(xs, means, width, yerr=err, capsize=3, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over queries (95% bootstrap CI)")
    ax.set_title(
        f"{len(report['pools'])} drug-review queries, {report['settings']['model_name']}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    if cost_rows:
        ax = axes[0][1]
        for j, name in enumerate(("ours", "chain")):
            med = [r["systems"][name]["median"] * 1e3 for r in cost_rows]
            err = [
                [m - r["systems"][name]["min"] * 1e3 for m, r in zip(med, cost_rows)],
                [r["systems"][name]["max"] * 1e3 - m for m, r in zip(med, cost_rows)],
            ]
            xs = [i + (j - 0.5) * width for i in range(len(cost_rows))]
            ax.bar(xs, med, width, yerr=err, capsize=3, label=name)
        ax.set_xticks(range(len(cost_rows)))
        ax.set_xticklabels(
            [f"{r['template']}\n({r['continuation_tokens']:.1f} query tokens)" for r in cost_rows],
            fontsize=8,
        )
        ax.set_ylabel("ms per document (median, min-max)")
        ax.set_title("query likelihood: one prefill (ours) vs a chain per token", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# -- main -------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: the default model)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    sized = {  # name: (type, help); default FULL[name], with --smoke SMOKE[name]
        "queries": (int, "the most frequent conditions"),
        "min_relevant": (int, "reviews a query's condition needs"),
        "relevant": (int, "relevant reviews per pool (at most)"),
        "negatives": (int, "other reviews per pool"),
        "doc_tokens": (int, "each review cut to its first N tokens"),
        "bootstrap": (int, "bootstrap resamples"),
        "cost_queries": (int, "pools timed in the cost measurement (0: none)"),
        "repeats": (int, "timed rounds of the cost measurement"),
    }
    for name, (kind, text) in sized.items():
        default = f"{FULL[name]}, --smoke {SMOKE.get(name, FULL[name])}"
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"{text} (default {default})")  # fmt: skip
    parser.add_argument("--k", type=int, default=10, help="nDCG@k")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--cost-templates",
        nargs="+",
        default=list(TEMPLATES),
        help="query forms of the cost measurement ({condition}: its name)",
    )
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="ours vs chain, log-prob per token"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="3 queries x 6 documents, 1 repeat")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    for name in sized:  # what the command line left unset
        if getattr(args, name) is None:
            setattr(args, name, (SMOKE if args.smoke else {}).get(name, FULL[name]))
    args.out = args.out or (SMOKE_OUT if args.smoke else OUT)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"--systems: unknown {sorted(unknown)}; known: {list(SYSTEMS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from prefillonly_sgl import Engine

    started = time.perf_counter()
    engine = Engine(args.model, device=args.device, dtype=args.dtype)
    start_seconds = time.perf_counter() - started
    print(f"[engine] started in {start_seconds:.1f} s", flush=True)
    try:
        pools = build_pools(engine.tokenizer, args)
        print(
            f"[data] {len(pools)} queries: "
            + ", ".join(f"{p.query} ({sum(p.relevant)}/{len(p.documents)})" for p in pools),
            flush=True,
        )
        measured = time.perf_counter()
        quality_rows = quality(engine, pools, args.systems.split(","), args)
        cost_rows = cost(engine, pools, args) if args.cost_queries > 0 else []
        measure_seconds = time.perf_counter() - measured
    finally:
        engine.shutdown()
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings["model_name"] = (
        Path(args.model).name if args.model else "SmolLM2-135M-Instruct (default)"
    )
    report = {
        "command": [sys.executable, *sys.argv],
        "settings": settings,
        "machine": machine(),
        "engine_start_seconds": start_seconds,
        "measure_seconds": measure_seconds,
        "pools": [
            {
                "query": p.query,
                "condition": p.condition,
                "review_ids": p.review_ids,
                "relevant": p.relevant,
            }
            for p in pools
        ],
        "quality": quality_rows,
        "cost": cost_rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    summary = markdown(report)
    (args.out / "summary.md").write_text(summary)
    plot(report, args.out / "rerank_quality.png")
    print(summary)
    print(
        f"engine start {start_seconds:.1f} s, measurements {measure_seconds:.1f} s; "
        f"wrote {args.out}/ (summary.md, results.json, rerank_quality.png)"
    )
    return 0 if all(r["agree"] for r in cost_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
