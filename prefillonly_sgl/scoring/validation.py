"""Checks on a score request before anything reaches SGLang (plain Python, no SGLang).

Stock SGLang 0.5.23 validates label ids, but some bad inputs kill its scheduler process
(an empty prompt; input token ids >= the vocabulary size) or silently return nothing
(empty items). Each check here names the offending field and value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError

TextOrIds = str | list[int]


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int  # rows of the LM head: every token id must be below it
    # Longest prompt of any request (generate requests keep KV for every token, so SGLang
    # bounds this by the KV pool as well as the context).
    max_prompt_tokens: int
    # Longest score prompt (query + item); None: max_prompt_tokens. With prefill-only KV a
    # score prompt keeps pool KV only for its reusable prefix: bounded by the context.
    max_scoring_prompt_tokens: int | None = None

    @property
    def scoring_prompt_tokens(self) -> int:
        if self.max_scoring_prompt_tokens is None:
            return self.max_prompt_tokens
        return self.max_scoring_prompt_tokens


def validate_label_token_ids(label_token_ids: object, vocab_size: int) -> list[int]:
    """Single-token labels (SGLang's label_token_ids): a list of distinct token ids."""
    labels = validate_labels(label_token_ids, vocab_size)
    for label in labels:
        if len(label) != 1:
            raise InvalidRequestError(
                f"label_token_ids must be integers, got {list(label)!r} (labels of several "
                "tokens: Engine.score or /v1/score_labels)"
            )
    return [label[0] for label in labels]


def validate_labels(label_token_ids: object, vocab_size: int) -> list[tuple[int, ...]]:
    """Labels as token-id tuples: each label one token id, or a list of them (a label of
    several tokens). Distinct labels; every id inside the vocabulary."""
    if not isinstance(label_token_ids, Sequence) or isinstance(label_token_ids, str | bytes):
        raise InvalidRequestError(
            f"label_token_ids must be a list of token ids, got {type(label_token_ids).__name__}"
        )
    if not label_token_ids:
        raise InvalidRequestError("label_token_ids is empty: give at least one label token id")
    labels = []
    for label in label_token_ids:
        if type(label) is int:
            label = (label,)
        elif isinstance(label, list | tuple) and label and all(type(t) is int for t in label):
            label = tuple(label)
        else:
            raise InvalidRequestError(
                "label_token_ids must be integers (a label of several tokens: a non-empty "
                f"list of them), got {label!r}"
            )
        for token in label:
            if not 0 <= token < vocab_size:
                # SGLang's wording (its clients and tests match it), naming the field.
                raise InvalidRequestError(
                    f"label_token_ids: Token ID {token} is out of vocabulary (vocab size: "
                    f"{vocab_size}; valid ids 0..{vocab_size - 1})"
                )
        labels.append(label)
    duplicates = sorted({t for t in labels if labels.count(t) > 1})
    if duplicates:
        shown = [t[0] if len(t) == 1 else list(t) for t in duplicates]
        raise InvalidRequestError(f"label_token_ids has duplicates: {shown}")
    return labels


def check_text_or_ids(value: object, name: str, vocab_size: int) -> None:
    """A text, or a list of token ids inside the vocabulary."""
    if isinstance(value, str):
        return
    if isinstance(value, list) and all(type(t) is int for t in value):
        bad = [t for t in value if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequestError(
                f"{name} has token ids outside the vocabulary (valid ids: 0..{vocab_size - 1}): "
                f"{bad[:5]}"
            )
        return
    raise InvalidRequestError(
        f"{name} must be a string or a list of token ids, got {type(value).__name__}"
    )


def prompt_token_counter(tokenizer) -> Callable[[TextOrIds, TextOrIds], int]:
    """count(first, second): the tokens of the prompt SGLang builds by joining them, first
    then second. Text is concatenated and tokenized whole, special tokens included (BPE
    may merge across the join); token ids are concatenated as they are."""

    def count(first: TextOrIds, second: TextOrIds) -> int:
        if isinstance(first, str):
            if tokenizer is None:
                raise InvalidRequestError(
                    "this engine runs without a tokenizer (skip_tokenizer_init): give the "
                    "query and items as token ids"
                )
            return len(tokenizer.encode(f"{first}{second}"))
        return len(first) + len(second)

    return count


def check_query_and_items(
    query: object, items: object, vocab_size: int, allow_empty: bool = False
) -> tuple[TextOrIds, list]:
    """(query, items) of a call scoring items after a query: the query a text or token ids
    ("" for None), items a list (one text alone: a list of it), non-empty unless
    allow_empty; each item is checked by the caller, which knows how it joins the query."""
    if query is None:
        query = ""
    check_text_or_ids(query, "query", vocab_size)
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list | tuple):
        raise InvalidRequestError(
            f"items must be a list of strings or token-id lists, got {type(items).__name__}"
        )
    if not items and not allow_empty:
        raise InvalidRequestError("items is empty: give at least one item to score")
    return query, list(items)


def validate_score_request(
    query: object,
    items: object,
    label_token_ids: object,
    limits: ModelLimits,
    count_tokens: Callable[[TextOrIds, TextOrIds], int],
    item_first: bool = False,
) -> tuple[TextOrIds, list[TextOrIds], list[tuple[int, ...]]]:
    """Returns (query, items, labels) normalised (labels: token-id tuples, see
    validate_labels); raises InvalidRequestError. No items is no rows, as in SGLang's
    Engine.score and /v1/score (its own tests expect []).

    count_tokens(first, second) gives the length of the prompt joined in that order
    (prompt_token_counter; the caller owns the tokenizer). SGLang joins query + item, or
    item + query with item_first.
    """
    labels = validate_labels(label_token_ids, limits.vocab_size)
    query, items = validate_prompts(query, items, limits, count_tokens, item_first)
    return query, items, labels


def validate_prompts(
    query: object,
    items: object,
    limits: ModelLimits,
    count_tokens: Callable[[TextOrIds, TextOrIds], int],
    item_first: bool = False,
) -> tuple[TextOrIds, list[TextOrIds]]:
    """validate_score_request's query and items, without labels (a classification head's
    request has none)."""
    query, items = check_query_and_items(query, items, limits.vocab_size, allow_empty=True)
    for i, item in enumerate(items):
        check_text_or_ids(item, f"items[{i}]", limits.vocab_size)
        if isinstance(item, str) != isinstance(query, str):
            raise InvalidRequestError(
                f"query and items[{i}] must both be text or both be token ids"
            )
        n_tokens = count_tokens(item, query) if item_first else count_tokens(query, item)
        if n_tokens == 0:
            raise InvalidRequestError(f"items[{i}]: the prompt (query + item) is empty")
        if n_tokens > limits.scoring_prompt_tokens:
            raise InvalidRequestError(
                f"items[{i}]: the prompt (query + item) is {n_tokens} tokens, longer than the "
                f"{limits.scoring_prompt_tokens} this engine accepts (raise context_length, "
                "or max_total_tokens without prefill-only KV, when starting the engine, or "
                "shorten the prompt)"
            )
    return query, items
