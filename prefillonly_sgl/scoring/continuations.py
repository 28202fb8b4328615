"""Continuation log-probabilities (plain Python, no SGLang): what to send, and the checks.

The log-probability of each token of a *continuation* given the prompt before it: the
quantity of query-likelihood reranking (the query's tokens after a document: Sachan et
al. 2022), of lm-eval's loglikelihood and of scoring a whole answer. It is read off one
prefill per prompt: SGLang's input logprobs from the last prompt position on
(sglang_runtime/continuation_logprobs.py), never one request per continuation token.

A call is (query, items, continuation): prompt i = query + items[i] as SGLang's score
joins them (text concatenated and tokenized whole, special tokens included; token ids
concatenated), then continuation i (text tokenized on its own, no special tokens: the
tokens whose log-probabilities come back). The query is the reusable prefix (as a score
request's): kept in the prefix cache, computed once for every item.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.reusable_prefix import with_prefix_ids
from prefillonly_sgl.scoring.validation import (
    ModelLimits,
    TextOrIds,
    check_query_and_items,
    check_text_or_ids,
)


@dataclass(frozen=True)
class ContinuationResult:
    """token_logprobs[i][j]: log P(continuation token j | prompt i, tokens before j);
    prompt_tokens / cached_tokens: as ScoreResult's (prompt and continuation counted)."""

    token_logprobs: list[list[float]]
    prompt_tokens: int
    cached_tokens: int = 0

    @property
    def sums(self) -> list[float]:
        """Each continuation's log-probability (the chain rule's product, in logs)."""
        return [math.fsum(row) for row in self.token_logprobs]

    @property
    def means(self) -> list[float]:
        """Each continuation's mean log-probability per token (query likelihood's score)."""
        return [math.fsum(row) / len(row) for row in self.token_logprobs]


@dataclass(frozen=True)
class ContinuationPlan:
    """What SGLang computes: per prompt its token ids (prompt, then continuation) and where
    the continuation starts; ``reusable``: the query's tokens (the shared prefix)."""

    input_ids: list[list[int]]
    starts: list[int]
    reusable: list[int]

    def continuation_lengths(self) -> list[int]:
        return [len(ids) - start for ids, start in zip(self.input_ids, self.starts)]


Encode = Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> token ids


def tokenizer_encode(tokenizer) -> Encode:
    """``Encode`` of a Hugging Face tokenizer (None: text is refused)."""

    def encode(text: str, special: bool) -> list[int]:
        if tokenizer is None:
            raise InvalidRequestError(
                "this engine runs without a tokenizer (skip_tokenizer_init): give the "
                "query, items and continuation as token ids"
            )
        return list(tokenizer.encode(text, add_special_tokens=special))

    return encode


def plan_continuations(
    query: object,
    items: object,
    continuation: object,
    limits: ModelLimits,
    encode: Encode,
) -> ContinuationPlan:
    """The checked plan of a call; InvalidRequestError naming the problem.

    continuation: one text (or token-id list) for every item, or a list of them, one per
    item (texts: a list of strings; token ids: a list of lists)."""
    query, items = check_query_and_items(query, items, limits.vocab_size)
    text = isinstance(query, str)
    encoded: dict[str, list[int]] = {}  # one shared continuation is tokenized once
    input_ids, starts = [], []
    for i, (item, (cont, name)) in enumerate(zip(items, _per_item(continuation, len(items)))):
        check_text_or_ids(item, f"items[{i}]", limits.vocab_size)
        check_text_or_ids(cont, name, limits.vocab_size)
        if isinstance(item, str) != text or isinstance(cont, str) != text:
            raise InvalidRequestError(
                f"query, items[{i}] and {name} must all be text or all be token ids"
            )
        prompt = encode(f"{query}{item}", True) if text else list(query) + list(item)
        if text:
            cont_ids = encoded.get(cont)
            if cont_ids is None:
                cont_ids = encoded[cont] = encode(cont, False)
        else:
            cont_ids = list(cont)
        if not prompt:
            raise InvalidRequestError(
                f"items[{i}]: the prompt (query + item) is empty: the continuation's first "
                "token needs a past"
            )
        if not cont_ids:
            raise InvalidRequestError(f"{name} is empty: nothing to score")
        total = len(prompt) + len(cont_ids)
        if total > limits.scoring_prompt_tokens:
            raise InvalidRequestError(
                f"items[{i}]: the prompt and continuation are {total} tokens, longer than "
                f"the {limits.scoring_prompt_tokens} this engine accepts (shorten the item)"
            )
        input_ids.append(prompt + cont_ids)
        starts.append(len(prompt))
    if text:
        reusable = encode(query, True) if query else []
    else:
        reusable = list(query)
    return ContinuationPlan(input_ids=input_ids, starts=starts, reusable=reusable)


def _per_item(continuation: object, n: int) -> list[tuple[TextOrIds, str]]:
    """Each item's continuation and its name in errors."""
    if isinstance(continuation, str):
        return [(continuation, "continuation")] * n
    if isinstance(continuation, list | tuple) and continuation:
        if all(type(t) is int for t in continuation):  # one token-id list for every item
            return [(list(continuation), "continuation")] * n
        if len(continuation) != n:
            raise InvalidRequestError(
                f"continuation has {len(continuation)} entries for {n} items: give one "
                "continuation, or one per item"
            )
        return [(c, f"continuation[{i}]") for i, c in enumerate(continuation)]
    raise InvalidRequestError(
        "continuation must be a string or a list of token ids (or a list of them, one per "
        f"item), got {continuation!r:.80}"
    )


def generate_fields(plan: ContinuationPlan) -> dict:
    """SGLang's generate request (GenerateReqInput's fields, /generate's JSON body) that
    computes a plan: prompt and continuation as token ids, no output token (a prefill-only
    request), input logprobs from each prompt's last position on (the logits there give
    the continuation's first token: logprob_start_len = start - 1), and the query's tokens
    as each prompt's reusable prefix (single_token/prefix.py's key: the tokenizer hook
    turns it into R, for the JCT scheduler's groups and prefill-only KV)."""
    params = {"max_new_tokens": 0, "custom_params": with_prefix_ids(None, plan.reusable)}
    return {
        "input_ids": plan.input_ids,
        "sampling_params": [dict(params) for _ in plan.input_ids],
        "return_logprob": True,
        "logprob_start_len": [start - 1 for start in plan.starts],
        "top_logprobs_num": 0,
    }


def token_logprobs_of(input_token_logprobs: list, continuation_length: int) -> list[float]:
    """The continuation's entries from SGLang's ``input_token_logprobs`` of a request whose
    logprob_start_len is its prompt's last position: SGLang writes no value for the first
    position of that range (None: it does not compute the logits before it), then one per
    token after it, the continuation's."""
    values = [entry[0] for entry in input_token_logprobs[1:]]
    if len(values) != continuation_length or any(v is None for v in values):
        raise RuntimeError(
            f"SGLang returned {len(values)} input logprobs for a continuation of "
            f"{continuation_length} tokens"
        )
    return [float(v) for v in values]
