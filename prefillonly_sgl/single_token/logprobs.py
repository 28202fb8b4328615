"""Completions' and chat's logprob fields (plain Python): `logprob_token_ids` rows,
`return_tokens_as_token_ids` and completions' text offsets.

`logprob_token_ids` (vLLM's extension): the logprobs of named token ids at the output
position, whatever their rank.

As in vLLM, a non-empty list replaces the natural top-k: each position's `top_logprobs`
holds the requested ids, in the order given, then the sampled token when it is not one of
them (vLLM's semantics since its logprob_token_ids tests of 2026: the set returned is the
requested ids and the sampled one; chat: a list of {token, logprob, bytes}; completions:
a dict token -> logprob). The position's own `token` / `logprob` stay the sampled
token's. SGLang computes them in the same pass as the top-k (after logit_bias, as every
logprob it returns), as `(logprob, token_id, text)` triples; `top_rows` reorders those
rows so SGLang's own response builders render them.
"""

from __future__ import annotations

from collections.abc import Sequence


def top_rows(
    token_ids_rows: Sequence[Sequence | None],
    requested: Sequence[int],
    sampled: Sequence | None = None,
) -> list:
    """Per output position, the triples of the requested ids in request order, then the
    position's sampled triple (`sampled[i]`, SGLang's output_token_logprobs) when its id
    was not requested."""
    rows = []
    for i, row in enumerate(token_ids_rows):
        if row is None:
            rows.append(None)
            continue
        by_id = {triple[1]: triple for triple in row}
        top = [by_id[t] for t in requested if t in by_id]
        chosen = sampled[i] if sampled is not None and i < len(sampled) else None
        # (the row may hold more ids than were named: allowed_token_ids' rows)
        if chosen is not None and chosen[1] not in requested:
            top.append(tuple(chosen))
        rows.append(top)
    return rows


# SGLang's meta_info lists of (logprob, token_id, text) triples: one per position, or a
# list of them (or None) per position.
TRIPLE_LISTS = ("input_token_logprobs", "output_token_logprobs")
ROW_LISTS = ("input_top_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def token_id_placeholder(token_id: int) -> str:
    """vLLM's `return_tokens_as_token_ids` spelling of a token: "token_id:<id>", for
    clients that cannot detokenize (a token's text may be part of a character)."""
    return f"token_id:{token_id}"


def tokens_as_ids(meta: dict) -> None:
    """Every logprob triple of a SGLang answer's ``meta`` (in place) with its text as the
    token's id placeholder, so SGLang's response builders render ids where texts were."""

    def placeholder(triple):
        return (triple[0], triple[1], token_id_placeholder(triple[1]), *triple[3:])

    for key in TRIPLE_LISTS:
        if meta.get(key):
            meta[key] = [placeholder(t) if t is not None else None for t in meta[key]]
    for key in ROW_LISTS:
        if meta.get(key):
            meta[key] = [
                None if row is None else [placeholder(t) for t in row] for row in meta[key]
            ]


def text_offsets(tokens: Sequence[str]) -> list[int]:
    """Completions' `text_offset`: each token's first character in the choice's text (the
    texts of the tokens before it, concatenated), as OpenAI and vLLM give it."""
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return offsets
