"""The requests each part sends: SGLang #9748's items shape, the recommendation shape (users
behind long profiles) and the warm-up passes of each. Token ids are random (seeded)."""

from __future__ import annotations

import random

from harness.engine_loadgen import ScoreCall


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(1, vocab) for _ in range(n)]


def items_calls(sizes, vocab, labels, n, seed) -> list[ScoreCall]:
    """SGLang #9748's requests: a fresh query and its items (no prefix shared)."""
    rng, shape = random.Random(seed), sizes["items"]
    return [
        ScoreCall(
            random_ids(rng, shape["query"], vocab),
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def user_profiles(sizes, vocab, seed: int = 7) -> list[list[int]]:
    """The users' profiles: the same in every run of the script (seed 7); the warm-up's
    users are others (another seed), so that it caches none of the measured profiles."""
    shape, rng = sizes["rec"], random.Random(seed)
    return [random_ids(rng, rng.randint(*shape["profile"]), vocab) for _ in range(shape["users"])]


def recommendation_calls(sizes, vocab, labels, n, seed, profiles=None) -> list[ScoreCall]:
    """n requests of the same users, each a random user's profile and fresh items: a
    user's requests spread over the run, as users come back (the first request of a user
    in an engine is its profile's miss)."""
    shape = sizes["rec"]
    profiles = profiles if profiles is not None else user_profiles(sizes, vocab)
    rng = random.Random(seed)
    return [
        ScoreCall(
            profiles[rng.randrange(len(profiles))],
            [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
            labels,
        )
        for _ in range(n)
    ]


def warmup_passes(part: str, sizes, vocab, labels) -> list[list[ScoreCall]]:
    """Representative requests of a load part, in passes sent as bursts: a burst (large
    batches), a second one (what the first compiled is now loaded), a single request
    (a batch of one). The recommendation's passes use warm-up users of their own: the
    first pass misses their profiles, the later ones hit them (paged prefix + ragged new
    tokens + merge: the kernels a cache hit runs)."""
    n = sizes["warmup_requests"]
    if part == "items":
        calls = items_calls(sizes, vocab, labels, 2 * n + 1, seed=90)
        return [calls[:n], calls[n : 2 * n], calls[2 * n :]]
    profiles = user_profiles(sizes, vocab, seed=8)[:n]
    shape = sizes["rec"]
    rng = random.Random(91)

    def pass_of(users):
        return [
            ScoreCall(
                profile,
                [random_ids(rng, shape["item"], vocab) for _ in range(shape["per_request"])],
                labels,
            )
            for profile in users
        ]

    return [pass_of(profiles), pass_of(profiles), pass_of(profiles[:1])]
