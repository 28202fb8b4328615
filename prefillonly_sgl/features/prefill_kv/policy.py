"""Which tokens of a scoring request keep KV in the pool (plain Python, unit-tested).

A scoring request (max_new_tokens == 0) never decodes, nor does a single-token request
(max_new_tokens == 1: its one token is sampled from the prefill's last position and
finishes it), so the KV of its tokens is needed
after its own forward only if a later request can reuse it from the prefix cache. Each
request carries a *reusable-prefix length* R (messages.py carries it to the scheduler):
tokens [0, R) keep per-layer KV and enter the radix cache; tokens [R, n) get no pool
slot, only DROPPED_SLOT (attention takes their k/v from the layer's hands).

    prompt tokens   [ cached prefix P | new, kept  | new, dropped          ]
                    0                 P            max(R, P, 1)             n

R is the longest common token prefix of the query's own tokenization and the full
prompt's tokenization: SGLang scores f"{query}{item}" as one string, so at the boundary
BPE may merge the query's last characters with the item's first ones; the common prefix
keeps exactly the tokens that any prompt starting with this query tokenizes the same way
so far (a token the merge changed is not claimed reusable). With token-id inputs it is
len(query). It is 0 with item_first (the item comes first: nothing is shared).

Chunked prefill: a later chunk reads the earlier chunks' KV from the pool, so a chunk that
is not the request's last keeps all of its tokens; only the last chunk drops its tail.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len

# The pool slot of every token whose KV is dropped: SGLang's dummy slot 0, which its token
# allocator never hands out (padded tokens write there). Its rows in req_to_token and
# out_cache_loc say "no KV kept" to the scheduler and to the attention backends.
DROPPED_SLOT = 0

MIN_KEPT_LEN = 1  # see kept_new_tokens


def runs_one_forward(max_new_tokens: int | None) -> bool:
    """A request whose whole life is one prefill: a score prompt (no output token) or a
    single-token request. Only these carry R (the tokenizer hooks attach it to nothing
    else); a request of more tokens keeps every token's KV for its decode steps."""
    return max_new_tokens in (0, 1)


def reusable_prefix_len(
    query_ids: Sequence[int] | None, prompt_ids: Sequence[int], image_pad: int | None = None
) -> int:
    """R for one prompt: tokens of the query that the prompt starts with (0 without a
    query). image_pad: a vision model's image placeholder token, where the prompt's tokens
    have each image expanded (image_expanded_prefix_len)."""
    if not query_ids:
        return 0
    if image_pad is not None and image_pad in prompt_ids:
        return image_expanded_prefix_len(query_ids, prompt_ids, image_pad)
    return common_prefix_len(query_ids, prompt_ids)


def image_expanded_prefix_len(
    query_ids: Sequence[int], prompt_ids: Sequence[int], image_pad: int
) -> int:
    """The common prefix in the prompt's positions where the query holds an image's
    placeholder once and the prompt its expansion (SGLang's processor writes one
    placeholder per image token: an image in the query is N positions of the prompt, all
    reusable). A query given already expanded counts the same."""
    i = j = 0
    while i < len(query_ids) and j < len(prompt_ids):
        if query_ids[i] == image_pad and prompt_ids[j] == image_pad:
            while j < len(prompt_ids) and prompt_ids[j] == image_pad:
                j += 1  # the whole expansion
            while i < len(query_ids) and query_ids[i] == image_pad:
                i += 1
            continue
        if query_ids[i] != prompt_ids[j]:
            break
        i += 1
        j += 1
    return j


def clamp_reusable_len(reusable_len: int, max_input_len: int) -> int:
    """R bounded so that the kept prefix fits the KV pool: max_input_len is SGLang's
    pool-bound input limit (it refuses len >= it). A smaller R is always correct: it
    only decides what is kept for later requests."""
    return min(reusable_len, max(0, max_input_len - 1))


def kept_new_tokens(prefix_len: int, extend_len: int, total_len: int, reusable_len: int) -> int:
    """How many of an extend's `extend_len` new tokens (after `prefix_len` cached ones, of
    a prompt of `total_len`) get pool slots: the first ones, up to max(R, prefix_len, 1).
    All of them when the extend is not the request's last chunk.

    At least the first token of the prompt is kept: SGLang takes a request whose row
    holds no KV (kv_allocated_len == 0) for one whose KV was already released."""
    if prefix_len + extend_len < total_len:
        return extend_len
    boundary = max(reusable_len, prefix_len, MIN_KEPT_LEN)
    return min(max(boundary - prefix_len, 0), extend_len)


def dropped_new_tokens(prefix_len: int, extend_len: int, total_len: int, reusable_len: int) -> int:
    return extend_len - kept_new_tokens(prefix_len, extend_len, total_len, reusable_len)


def anchors_in_extend(anchors: Sequence[int], prefix_len: int) -> list[int]:
    """A setwise request's readout positions (SGLang's token_indices_to_pool: full-prompt
    positions of its score-extraction tokens) as rows of its extend, which starts after
    the `prefix_len` tokens the prefix cache (or its leader) gave it. The cache match
    stops before the first anchor (its logprob_start_len), so every anchor is computed."""
    if anchors and min(anchors) < prefix_len:
        raise ValueError(
            f"a score-extraction anchor at {min(anchors)} lies in the {prefix_len} tokens "
            "taken from the prefix cache"
        )
    return [a - prefix_len for a in anchors]


def discarded_readout_rows(
    anchors: Sequence[int], prefix_len: int, first_logprob_row: int, extend_len: int
) -> list[int]:
    """Rows of its extend that a setwise request whose anchors_in_extend failed reads in
    the forward it still takes (its output is dropped and the request fails): one per
    anchor, as SGLang's readout and its logprob bookkeeping count them for the batch's
    other requests, each inside [first_logprob_row, extend_len), where SGLang's
    bookkeeping counts it (first_logprob_row: the batch's extend_logprob_start_len of
    the request)."""
    last = extend_len - 1
    low = min(max(first_logprob_row, 0), last)
    return [min(max(a - prefix_len, low), last) for a in anchors]


def kept_rows(kept: Sequence[int], extend_lens: Sequence[int]) -> list[int]:
    """The batch's new-token rows (requests in order) that get a real slot, ascending,
    known on the host, so that the allocation scatters the
    real slots by index instead of by a boolean mask on the device (which would wait for
    the device: a host-device sync per batch)."""
    rows: list[int] = []
    start = 0
    for k, n in zip(kept, extend_lens, strict=True):
        rows.extend(range(start, start + k))
        start += n
    return rows


# What a score prompt of a recurrent-state model (linear attention, mamba) does with its
# KV and its state (recurrent_state_plan).
AS_IS = "as_is"  # the cache keeps a state where the kept prefix ends: drop the suffix KV
SPLIT = "split"  # first extend up to R (the cache keeps the state there), then the rest
KEEP_ALL = "keep_all"  # no state at R is possible: keep every token, as stock SGLang


def recurrent_state_plan(
    prefix_len: int, total_len: int, reusable_len: int, chunk_budget: int | None
) -> str:
    """A recurrent layer's state exists only at the end of an extend, and SGLang's cache
    stores it with the prefix a request leaves there. Prefill-only KV leaves [0, boundary)
    (kept_new_tokens), so it may drop the suffix only where the cache holds the state at
    the boundary; otherwise the prompt's final state would be stored for a shorter
    prefix, which a later prompt would continue from: silently wrong.

    - R covers the prompt, or the prompt matched a cached prefix at R or beyond (a match
      always ends at a stored state): as it is.
    - a cold R inside the prompt: its first extend ends at R (SPLIT), so the cache keeps
      the state there; unless SGLang's chunk budget would cut the prompt before R anyway.
    - nothing reusable and nothing matched (the boundary would be the first token), or a
      chunked prompt: every token kept, and the cache gets the state at the end."""
    if reusable_len >= total_len or (prefix_len > 0 and prefix_len >= reusable_len):
        return AS_IS
    if reusable_len == 0:
        return KEEP_ALL
    if chunk_budget is not None and chunk_budget < reusable_len - prefix_len:
        return KEEP_ALL
    return SPLIT
