"""Labels of several tokens, on SGLang's TokenizerManager (what to compute: scoring/label_trie.py).

A score call whose labels are not all single tokens runs as two rounds of ordinary score
requests (max_new_tokens=0, prefill-only):

1. the roots: the call itself (query, items) as a single-token call would send it, reading
   the labels' first tokens, with each prompt's KV kept whole in the prefix cache
   (reusable_prefix.keep_whole_prompts; otherwise prefill-only KV keeps only the query's);
2. the continuations, all at once: per item one request whose query is the prompt's own
   token ids and whose items are the label prefixes (the trie's nodes), each reading the
   next tokens below its node. SGLang's prefix cache then holds the prompt, so each
   continuation computes only its few label tokens; their reusable prefix is the prompt
   (R = len(query) for token-id queries), so the JCT scheduler groups each with its
   prompt and predicts it as a cache hit.

Log-probabilities come from SGLang's return_token_logprobs (over the whole vocabulary, as
apply_softmax=False reads them); the products and the normalisation are label_trie's.
If the pool cannot hold every prompt of the call, the oldest are evicted before their
continuations run, which then recompute them: slower, never different.

A call with images (``image_data``, per item: a vision-language model's prompts are text,
its processor expands their placeholders) sends its continuations as text too: per prompt
the prompt's text as the query with its images again (the same bytes, so the prefix
cache holds it, images included), the label prefixes as their decoded text, each checked
to tokenize back to the prompt's tokens then its own (scoring/appended_tokens.py:
NotExactAsText otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib

from prefillonly_sgl.features.prefill_kv.tokenizer_process import keep_whole_prompts
from prefillonly_sgl.scoring.appended_tokens import appended_text
from prefillonly_sgl.scoring.label_trie import Label, LabelTrie, label_scores, sequence_logprobs
from prefillonly_sgl.scoring.validation import TextOrIds


def prompt_token_ids(
    tokenizer, query: TextOrIds, items: list[TextOrIds], item_first: bool
) -> list[list[int]]:
    """Each prompt's token ids as SGLang's score_request builds them: text joined and
    tokenized whole (special tokens included), token ids concatenated."""
    if isinstance(query, str):
        texts = [f"{item}{query}" if item_first else f"{query}{item}" for item in items]
        return [list(tokenizer.encode(text)) for text in texts]
    return [list(item) + list(query) if item_first else list(query) + list(item) for item in items]


async def root_logprobs(
    tokenizer_manager,
    query: TextOrIds,
    items: list[TextOrIds],
    trie: LabelTrie,
    item_first: bool,
    request=None,
    image_data: list[list[bytes]] | None = None,
) -> tuple[list[list[float]], int]:
    """Round 1: per item, the log-probabilities of the labels' first tokens (the trie
    root's next tokens) after the prompt, and the prompt tokens sent. With labels of
    several tokens each prompt's KV is kept whole for round 2."""
    keep = contextlib.nullcontext() if trie.one_token_labels else keep_whole_prompts()
    images = {} if image_data is None else {"image_data": image_data}
    with keep:
        roots = await tokenizer_manager.score_request(
            query=query,
            items=items,
            label_token_ids=list(trie.next_tokens[()]),
            apply_softmax=False,
            item_first=item_first,
            request=request,
            return_token_logprobs=True,
            **images,
        )
    return roots.token_logprobs, roots.prompt_tokens


async def node_logprobs(
    tokenizer_manager, prompts: list[list[int]], trie: LabelTrie, request=None
) -> tuple[list[dict[Label, list[float]]], int]:
    """Round 2, all at once: per prompt (token ids, as SGLang built them in round 1), each
    continuation node's next-token log-probabilities, and the prompt tokens sent."""
    nodes = trie.continuations
    if not nodes:
        return [{} for _ in prompts], 0
    continued = await asyncio.gather(
        *(
            tokenizer_manager.score_request(
                query=prompt,
                items=[list(node) for node in nodes],
                label_token_ids=[list(trie.next_tokens[node]) for node in nodes],
                apply_softmax=False,
                request=request,
                return_token_logprobs=True,
            )
            for prompt in prompts
        )
    )
    by_prompt = [dict(zip(nodes, more.token_logprobs, strict=True)) for more in continued]
    return by_prompt, sum(c.prompt_tokens for c in continued)


async def node_logprobs_with_images(
    tokenizer_manager, texts: list[str], image_data: list[list[bytes]], trie: LabelTrie, request
) -> tuple[list[dict[Label, list[float]]], int]:
    """Round 2 of a call with images: per prompt (its text and images, as round 1 sent
    them) each continuation node's next-token log-probabilities, the nodes as text."""
    tokenizer = tokenizer_manager.tokenizer
    nodes = trie.continuations

    def node_texts(text: str) -> list[str]:
        ids = list(tokenizer.encode(text))
        encode, decode = tokenizer.encode, tokenizer.decode
        return [appended_text(text, ids, node, encode, decode) for node in nodes]

    continued = await asyncio.gather(
        *(
            tokenizer_manager.score_request(
                query=text,
                items=node_texts(text),
                label_token_ids=[list(trie.next_tokens[node]) for node in nodes],
                apply_softmax=False,
                request=request,
                return_token_logprobs=True,
                image_data=[list(images)] * len(nodes),
            )
            for text, images in zip(texts, image_data, strict=True)
        )
    )
    by_prompt = [dict(zip(nodes, more.token_logprobs, strict=True)) for more in continued]
    return by_prompt, sum(c.prompt_tokens for c in continued)


async def read_nodes(
    tokenizer_manager,
    query: TextOrIds,
    items: list[TextOrIds],
    trie: LabelTrie,
    item_first: bool = False,
    request=None,
    first_round=contextlib.nullcontext,
    image_data: list[list[bytes]] | None = None,
) -> tuple[list[dict[Label, list[float]]], int]:
    """Both rounds: per item, every trie node's next-token log-probabilities (the root
    ``()`` included), what label_trie combines; and the prompt tokens of every request
    sent. first_round: a context manager factory round 1 runs inside (the front's usage
    record of the prompts' own forwards). image_data: per item its images (text query
    and items, query first)."""
    with first_round():
        roots, tokens = await root_logprobs(
            tokenizer_manager, query, items, trie, item_first, request, image_data
        )
    nodes = [{} for _ in items]
    if trie.continuations and image_data is not None:
        texts = [f"{query}{item}" for item in items]
        nodes, more_tokens = await node_logprobs_with_images(
            tokenizer_manager, texts, image_data, trie, request
        )
        tokens += more_tokens
    elif trie.continuations:
        prompts = prompt_token_ids(tokenizer_manager.tokenizer, query, items, item_first)
        nodes, more_tokens = await node_logprobs(tokenizer_manager, prompts, trie, request)
        tokens += more_tokens
    return [{(): root, **more} for root, more in zip(roots, nodes, strict=True)], tokens


async def score_label_sequences(
    tokenizer_manager,
    query: TextOrIds,
    items: list[TextOrIds],
    trie: LabelTrie,
    apply_softmax: bool,
    length_normalize: bool,
    item_first: bool,
    request=None,
    temperature: float = 1.0,
    image_data: list[list[bytes]] | None = None,
) -> tuple[list[list[float]], int, list[list[float]]]:
    """(scores per item in label order, prompt tokens of every request sent, each
    label's sequence log-probability per item: the token_logprobs of several tokens).
    image_data: per item its images (read_nodes)."""
    by_item, prompt_tokens = await read_nodes(
        tokenizer_manager, query, items, trie, item_first, request, image_data=image_data
    )
    lengths = [len(label) for label in trie.labels]
    scores, sequences = [], []
    for by_node in by_item:
        logprobs = sequence_logprobs(trie, by_node)
        sequences.append(logprobs)
        scores.append(label_scores(logprobs, lengths, apply_softmax, length_normalize, temperature))
    return scores, prompt_tokens, sequences
