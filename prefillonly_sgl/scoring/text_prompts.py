"""A score call's text prompts sent as token ids, so they reach the scheduler together
(plain Python; the tokenizer's encode is passed in).

SGLang's TokenizerManager tokenizes a batch that holds text one prompt at a time and
dispatches each as soon as it is tokenized (`_handle_batch_request`); the scheduler's next
plan then sees the first prompt alone, and a query with its items takes two forwards (the
first prompt computes the query, the others follow as its cache hits), where the JCT
scheduler would pack them into one. A batch of token ids goes to the scheduler as one
message (`_send_batch_request`). So a text call is tokenized here, exactly as SGLang would
tokenize it (each query + item joined and tokenized whole, special tokens included), and
sent as ids: the query becomes the prompts' common prefix with the query's own tokens
(what the tokenizer hook makes a text query's reusable prefix R of), the items the rest.
"""

from __future__ import annotations

from collections.abc import Callable

from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len


def joined_token_ids(
    encode: Callable[[str], list[int]], query: str, items: list[str]
) -> tuple[list[int], list[list[int]]]:
    """(query ids, each item's ids): query + item is each prompt's tokens, whole."""
    prompts = [list(encode(f"{query}{item}")) for item in items]
    own = list(encode(query))
    shared = min(common_prefix_len(own, p) for p in prompts)
    shared = min(shared, min(len(p) for p in prompts) - 1)  # every item keeps a token
    return prompts[0][:shared], [p[shared:] for p in prompts]
