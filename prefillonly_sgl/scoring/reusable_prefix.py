"""How a request carries its reusable prefix to the tokenizer hook (plain Python): the
token ids later requests can reuse, inside the request's `custom_params`
(PREFIX_IDS_KEY, main process only), set by the fronts that know it (a single-token
OpenAI request's door: single_token/prefix.py; a continuation request:
continuations.py) and read by features/prefill_kv/tokenizer_process.py, which replaces it
by R (features/prefill_kv/messages.py), the value the scheduler reads.
"""

from __future__ import annotations

from collections.abc import Sequence

PREFIX_IDS_KEY = "prefillonly_prefix_ids"
WHOLE_PROMPT = "whole"  # PREFIX_IDS_KEY's value for "all of the prompt" (loglikelihoods)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids two sequences share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def with_prefix_ids(custom_params: dict | None, prefix_ids: Sequence[int]) -> dict:
    return {**(custom_params or {}), PREFIX_IDS_KEY: list(prefix_ids)}


def prefix_ids_in(custom_params: object) -> list[int] | str | None:
    """The prefix a single-token or loglikelihood request carries ([]: none; WHOLE_PROMPT:
    all of it), or None (neither)."""
    if not isinstance(custom_params, dict) or PREFIX_IDS_KEY not in custom_params:
        return None
    value = custom_params[PREFIX_IDS_KEY]
    return WHOLE_PROMPT if value == WHOLE_PROMPT else list(value)


def without_prefix_ids(custom_params: dict) -> dict:
    return {k: v for k, v in custom_params.items() if k != PREFIX_IDS_KEY}


def with_whole_prompt(custom_params: dict | None) -> dict:
    """The whole prompt is the reusable prefix (a loglikelihood request: the next one of
    its task extends it, or shares all but its last tokens)."""
    return {**(custom_params or {}), PREFIX_IDS_KEY: WHOLE_PROMPT}
