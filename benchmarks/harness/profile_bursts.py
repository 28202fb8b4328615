"""Bursts of the paper's recommendation shape on one Engine (head_burst.py, lora_burst.py):
requests that each put items behind a fresh profile of random token ids, all sent at once.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

LABELS = [11, 12]  # two token ids of the default model's vocabulary


def add_shape_arguments(parser: argparse.ArgumentParser, requests: int, rounds: int) -> None:
    """--rounds, --requests, --items, --profile-tokens, --item-tokens, --dtype."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--requests", type=int, default=requests, help="sent at once")
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--profile-tokens", type=int, default=1000)
    parser.add_argument("--item-tokens", type=int, default=100)
    parser.add_argument("--dtype", default="float32")


class Bursts:
    """Fresh requests each call (seeded), timed as one burst."""

    def __init__(self, args, seed: int = 76) -> None:
        self.args = args
        self.rng = random.Random(seed)

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(200, 40000) for _ in range(n)]

    def requests(self) -> list[tuple[list[int], list[list[int]]]]:
        """(profile, items) for each request of a burst: every profile cold."""
        a = self.args
        return [
            (self.tokens(a.profile_tokens), [self.tokens(a.item_tokens) for _ in range(a.items)])
            for _ in range(a.requests)
        ]

    def seconds(self, engine, **score_options) -> float:
        """One burst's seconds until every request is answered. score_options: keyword
        arguments of Engine.async_score; a list value gives each request its own."""
        requests = self.requests()

        def option(i: int) -> dict:
            return {k: v[i] if isinstance(v, list) else v for k, v in score_options.items()}

        async def all_at_once():
            calls = (
                engine.async_score(profile, items, **option(i))
                for i, (profile, items) in enumerate(requests)
            )
            return await asyncio.gather(*calls)

        started = time.perf_counter()
        engine.run_until_complete(all_at_once())
        return time.perf_counter() - started
