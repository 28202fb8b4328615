"""Which prompt positions an echo request takes from the side table, and how they join
the positions it computes (plain Python, unit-tested).

Positions: token t (t >= 1) has an entry (its logprob given tokens [0, t), the top-k of
the distribution at position t - 1); token 0 has none (None, as OpenAI returns it).

A request whose first M tokens are in the prefix cache (slots s_0 .. s_{M-1}) and whose
table rows s_1 .. s_L hold entries extends from position L (L <= M - 1): its forward
computes positions L .. T - 1, i.e. the entries of tokens L + 1 .. T (T: the generated
token). Token L's entry needs the distribution at position L - 1, which is why it comes
from the table and why the last cached position (M - 1) is computed again rather than
read as KV: the entry of token M needs its hidden state.

    prompt   [ 0 | entries from the table 1..L | computed L+1..T-1 ] (+ generated token)
    KV       [ cached 0..L-1                   | computed L..T-1    ]
"""

from __future__ import annotations

from prefillonly_sgl.features.prompt_logprobs.table import MAX_TOP_K, CachedRows


def caches_prompt_logprobs(
    *,
    return_logprob: bool,
    logprob_start_len: int,
    top_logprobs_num: int,
    named_token_ids: object,
    max_new_tokens: int | None,
    flat_top_logprobs: bool,
    prompt_len: int,
) -> bool:
    """Whether a request's prompt entries can come from (and go to) the side table: it
    asks for every prompt position's logprob (echo: logprob_start_len 0) with a top-k the
    table holds, no named token ids (their rows are not kept), and runs one forward
    (max_new_tokens 0 or 1: a longer generation's entries are stock)."""
    return (
        return_logprob
        and logprob_start_len == 0
        and 0 <= top_logprobs_num <= MAX_TOP_K
        and named_token_ids is None
        and max_new_tokens in (0, 1)
        and not flat_top_logprobs
        and prompt_len >= 2
    )


def table_positions(matched_len: int, usable_rows: int) -> int:
    """L: how many prompt entries (tokens 1..L) come from the table, given the cached
    prefix's length M and how many of its rows s_1, s_2, ... hold usable entries. At most
    M - 1: the last cached position is computed again (module docstring)."""
    if matched_len <= 1:
        return 0
    return max(0, min(matched_len - 1, usable_rows))


def splice(
    computed_logprobs: list,
    computed_ids: list[int],
    computed_top: tuple[list, list] | None,
    cached: CachedRows | None,
    prompt_ids: list[int],
) -> tuple[list, list[int], tuple[list, list] | None]:
    """The whole prompt's entries: SGLang's computed ones start at position L
    (= len(cached)) with a None (it has no entry for its first position); the table's
    rows replace that None by the entries of tokens 1..L, after token 0's None.
    computed_top: (values rows, id rows), each starting with None, or None (k = 0)."""
    n_cached = len(cached) if cached is not None else 0
    if n_cached == 0:
        return computed_logprobs, computed_ids, computed_top
    if len(computed_logprobs) != len(prompt_ids) - n_cached:
        raise ValueError(
            f"{len(computed_logprobs)} computed positions after {n_cached} cached ones for a "
            f"prompt of {len(prompt_ids)} tokens"
        )
    logprobs = [None, *cached.logprobs, *computed_logprobs[1:]]
    ids = [*prompt_ids[:n_cached], *computed_ids]
    top = None
    if computed_top is not None:
        values, top_ids = computed_top
        top = (
            [None, *cached.top_values, *values[1:]],
            [None, *cached.top_ids, *top_ids[1:]],
        )
    return logprobs, ids, top
