"""vLLM's `allowed_token_ids`: the answer restricted to a set of tokens (plain Python).

vLLM masks every other token's logit to -inf before it samples (its builtin logits
processor), then applies temperature, top-k, top-p and min-p to what is left; its
logprobs are taken before any of that by default (`--logprobs-mode raw_logprobs`), so
the restriction changes which token is sampled, never the logprobs reported.

A single-token request restricted to a set of tokens is a label-scoring request: the
prefill's last position gives every allowed token's logprob (SGLang's
`token_ids_logprob`), and the answer is chosen among them (`restricted_choice`) after the
forward, as vLLM's sampler would have chosen it; the position's logprobs (top-k,
`logprob_token_ids`) stay the unrestricted ones. A request generating more than one token
is restricted by SGLang's sampler at every step instead (`mask_bias`: every other token
biased out, as vLLM masks them), where the logprobs are then taken after the mask, as
SGLang takes every logprob after `logit_bias` (docs/openai.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError

FIELD = "allowed_token_ids"
SAMPLING_EPS = 1e-6  # SGLang's: a temperature below it is greedy (top_k 1)
# A bias that takes a token out of sampling without an infinity in the logprobs (SGLang
# adds it to the logits; exp(-1e4) is 0 in float32).
MASKED_OUT = -1e4


def check_allowed_token_ids(ids: object, vocab_size: int) -> list[int]:
    """The ids, checked: a non-empty list of token ids inside the vocabulary (duplicates
    kept once, in order); InvalidRequestError naming the field otherwise."""
    if not isinstance(ids, list) or not ids:
        raise InvalidRequestError(f"{FIELD} must be a non-empty list of token ids, got {ids!r:.80}")
    bad = [t for t in ids if type(t) is not int or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"{FIELD} must be token ids from 0 to {vocab_size - 1}, got {bad[:5]!r:.80}"
        )
    return list(dict.fromkeys(ids))


def logprob_ids(named: Sequence[int] | None, allowed: Sequence[int] | None) -> list[int]:
    """The token ids whose logprobs a single-token request reads at its position (SGLang's
    `token_ids_logprob`): `logprob_token_ids`, then every allowed token not among them
    (the answer is chosen among the allowed ones after the forward: restricted_answer)."""
    ids = list(named or [])
    if allowed:
        ids += [t for t in allowed if t not in ids]
    return ids


def mask_bias(
    allowed: Sequence[int], vocab_size: int, user_bias: Mapping | None = None
) -> dict[str, float]:
    """SGLang's `logit_bias` for a generating request: every token outside `allowed`
    masked out; the user's own bias kept on the allowed ones."""
    keep = set(allowed)
    bias = {str(t): MASKED_OUT for t in range(vocab_size) if t not in keep}
    for key, value in (user_bias or {}).items():
        if int(key) in keep:
            bias[str(int(key))] = float(value)
    return bias


def resolved_sampling(sampling_params) -> dict:
    """The first prompt's sampling parameters as SGLang resolved them (a GenerateReqInput's
    sampling_params: the model's defaults filled in): what a restricted or choice answer
    samples with."""
    first = sampling_params[0] if isinstance(sampling_params, list) else sampling_params
    keys = ("temperature", "top_p", "top_k", "min_p", "sampling_seed", "stop_token_ids",
            "ignore_eos", "skip_special_tokens")  # fmt: skip
    return {key: (first or {}).get(key) for key in keys}


def is_greedy(sampling: Mapping) -> bool:
    temperature = sampling.get("temperature")
    return (temperature is not None and temperature < SAMPLING_EPS) or sampling.get("top_k") == 1


def restricted_choice(rows: Sequence, sampling: Mapping, index: int = 0):
    """The (logprob, token_id, text) row among `rows` (the allowed tokens' rows of one
    position) that the sampler picks: the most likely one when greedy (the lowest id on a
    tie, as an argmax over the masked logits), else one drawn from their probabilities
    renormalised, after top-k, top-p and min-p over them (vLLM's order). SGLang's
    logprobs for a sampled request are taken at its temperature, so exp(logprob) is
    already each token's tempered probability. `sampling`: the request's resolved
    temperature, top_p, top_k, min_p and sampling_seed; `index`: the choice (n > 1
    draws each choice apart, each seeded by the seed and its index)."""
    rows = [r for r in rows if r is not None and r[0] is not None]
    if not rows:
        raise ValueError("no logprob for any allowed token")
    if is_greedy(sampling):
        return max(rows, key=lambda r: (r[0], -r[1]))
    ranked = sorted(rows, key=lambda r: (-r[0], r[1]))
    top = ranked[0][0]
    probs = [math.exp(r[0] - top) for r in ranked]
    total = sum(probs)
    probs = [p / total for p in probs]
    keep = len(ranked)
    top_k = sampling.get("top_k")
    if isinstance(top_k, int) and top_k > 0:
        keep = min(keep, top_k)
    top_p = sampling.get("top_p")
    if top_p is not None and top_p < 1.0:
        cumulative, cut = 0.0, keep
        for i in range(keep):
            if cumulative >= top_p:
                cut = i
                break
            cumulative += probs[i]
        keep = max(1, cut)
    min_p = sampling.get("min_p")
    if min_p:
        keep = max(1, sum(1 for p in probs[:keep] if p >= min_p * probs[0]))
    seed = sampling.get("sampling_seed")
    rng = random.Random(f"{seed}:{index}") if seed is not None else random.SystemRandom()
    return rng.choices(ranked[:keep], weights=probs[:keep], k=1)[0]


def finish_of(token_id: int, stop_ids: set[int], ignore_eos: bool, eos_ids: set[int]):
    """SGLang's finish reason for a one-token answer: stopped on a stop token (the
    model's EOS unless ignore_eos, or the request's stop_token_ids), else its length."""
    if token_id in stop_ids or (token_id in eos_ids and not ignore_eos):
        return {"type": "stop", "matched": token_id}
    return {"type": "length", "length": 1}


@dataclass(frozen=True)
class RestrictedAnswer:
    """A single-token choice's answer among the allowed tokens, replacing the one SGLang's
    unrestricted sampler gave it."""

    row: tuple  # (logprob, token_id, text): the position's row of the chosen token
    finish: dict  # SGLang's finish reason (finish_of)
    text: str  # the choice's text: the token's, or "" when it stops the answer


def restricted_answer(
    rows: Sequence,
    allowed: Sequence[int],
    sampling: Mapping,
    index: int,
    sampled,
    eos_ids: set[int],
    decode: Callable[[int, bool], str],
) -> RestrictedAnswer | None:
    """One choice's answer picked among the allowed tokens (restricted_choice over their
    rows of the position) where SGLang's unrestricted one (`sampled`, its (logprob,
    token_id, text) row) is not it; None where it is. decode(token_id, skip_special):
    the token's text (special tokens skipped unless the request's skip_special_tokens
    is false)."""
    keep = set(allowed)
    chosen = restricted_choice([r for r in rows if r[1] in keep], sampling, index)
    if sampled is not None and sampled[1] == chosen[1]:
        return None
    finish = finish_of(
        chosen[1], set(sampling.get("stop_token_ids") or ()), bool(sampling.get("ignore_eos")),
        set(eos_ids),
    )  # fmt: skip
    if finish["type"] == "stop":
        text = ""
    else:
        text = decode(chosen[1], sampling.get("skip_special_tokens") is not False)
    return RestrictedAnswer(tuple(chosen), finish, text)
