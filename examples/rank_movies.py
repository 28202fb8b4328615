"""Example: rank candidate films for users with @prefillonly.ranker, on the embedded
default model (SmolLM2-135M-Instruct).

The model reads each film's one-line plot and gives the probability of each theme
(labels "space", "love", "crime"); a user's ranking sorts the films by a weighted
combination of those probabilities: the user's taste. The few-shot examples are the
prompt's shared prefix: each call is one score request per shared prefix, whose prefix
the engine's scheduler computes once (the other films then hit SGLang's prefix cache).

    python examples/rank_movies.py [--top-k 5] [--model FOLDER] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
from typing import Literal

import prefillonly_sgl as prefillonly

Theme = Literal["space", "love", "crime"]

EXAMPLES = [  # (film, theme): the few-shot part of the shared prefix
    ("Star Wars (1977): rebels fight an evil empire among the stars.", "space"),
    ("Pretty Woman (1990): a rich businessman falls in love with an escort.", "love"),
    ("Goodfellas (1990): a young man rises through the ranks of the mob.", "crime"),
    ("Alien (1979): the crew of a space freighter is hunted by a creature.", "space"),
    ("Sleepless in Seattle (1993): a boy finds his widowed father a new love by radio.", "love"),
    ("Pulp Fiction (1994): two hitmen, a boxer and a gangster's wife cross paths.", "crime"),
]
CANDIDATES = {  # real films with a one-line plot, and the theme each is mainly about
    "Apollo 13 (1995): astronauts try to get home after an explosion damages their ship.": "space",
    "Gravity (2013): two astronauts are stranded in orbit after debris hits the shuttle.": "space",
    "The Martian (2015): an astronaut left behind on Mars must survive until rescue.": "space",
    "Interstellar (2014): explorers travel through a wormhole to find a new home planet.": "space",
    "Notting Hill (1999): a bookshop owner falls in love with a famous actress.": "love",
    "You've Got Mail (1998): two business rivals fall in love online.": "love",
    "Roman Holiday (1953): a princess escapes her duties and falls for a reporter in Rome.": "love",
    "Four Weddings and a Funeral (1994): a man keeps meeting the same woman at weddings.": "love",
    "The Godfather (1972): the head of a mafia family hands his empire to his son.": "crime",
    "Heat (1995): a detective hunts a crew of professional bank robbers in Los Angeles.": "crime",
    "Fargo (1996): a car salesman's plan to have his wife kidnapped goes badly wrong.": "crime",
    "Se7en (1995): two detectives track a serial killer who uses the seven deadly sins.": "crime",
}
USERS = {  # taste: a weight per theme; the ranking score is the expected taste
    "space fan": {"space": 1.0, "love": 0.0, "crime": 0.2},
    "romantic": {"space": 0.0, "love": 1.0, "crime": 0.0},
    "crime buff": {"space": 0.1, "love": -0.5, "crime": 1.0},
}


@prefillonly.ranker(labels=Theme)
def recommend(film: str) -> prefillonly.Prompt:
    shots = "".join(f"Film: {f}\nTheme: {t}\n\n" for f, t in EXAMPLES)
    return prefillonly.Prompt(
        prefix="Each film and its main theme (space, love or crime):\n\n" + shots,
        item=f"Film: {film}\nTheme:",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--model", default=None, help="model folder (default: embedded)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16: ~2x faster on CPU")
    args = parser.parse_args()

    hits = 0
    with prefillonly.Engine(args.model, device=args.device, dtype=args.dtype) as engine:
        for user, taste in USERS.items():
            ranking = recommend(
                items=list(CANDIDATES), score=taste, top_k=args.top_k, engine=engine
            )
            favourite = max(taste, key=taste.get)
            print(f"\nTop {args.top_k} for the {user} ({favourite}):")
            for rank, r in enumerate(ranking.items, 1):
                hits += CANDIDATES[r.item] == favourite
                probs = " ".join(f"{t}={p:.2f}" for t, p in r.probs.items())
                print(f"{rank}. score={r.score:+.2f} ({probs})  {r.item.split(':')[0]}")
    total = args.top_k * len(USERS)
    print(f"\n{hits}/{total} top-{args.top_k} picks are about the user's favourite theme")


if __name__ == "__main__":
    main()
