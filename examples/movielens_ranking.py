"""Pipeline: rank films for MovieLens users with a @prefillonly.ranker run by the batch
runner (prefillonly_sgl/pipelines/movielens.py); prints hit rate / NDCG next to the
popularity and random baselines, and the prefix-cache hit share.

    python examples/movielens_ranking.py [--users 30] [--negatives 9] [--model FOLDER]
"""

from __future__ import annotations

import argparse

from prefillonly_sgl.pipelines import movielens
from prefillonly_sgl.pipelines.common import add_engine_arguments

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--negatives", type=int, default=9, help="unrated films per user")
    parser.add_argument("--profile-films", type=int, default=40, help="ratings in a profile")
    add_engine_arguments(parser)
    args = parser.parse_args()
    movielens.print_report(
        movielens.run(
            args.users,
            args.negatives,
            args.profile_films,
            model=args.model,
            device=args.device,
            out=args.out,
        )  # fmt: skip
    )
