"""vLLM's conventions where they meet another peer's on the same path (plain Python, no
SGLang), each a small decision the endpoints apply (docs/server.md, "Peer conventions on
one path", vLLM):

- echoes_documents: whether a rerank result carries its `document`. vLLM always echoes it
  (its response model requires the field); Cohere echoes it only when asked
  (`return_documents`, default false) and otherwise leaves the key out.
- is_vllm_score_body: /v1/score in vLLM's shapes (`queries` / `documents` or `items`,
  `data_1` / `data_2`, `text_1` / `text_2`) beside SGLang's (`query` / `items` /
  `label_token_ids`), told apart by the body's own keys.
- is_vllm_generative_score_body: vLLM's score body with `label_token_ids` (its generative
  scoring on /v1/score, apis/vllm_generative_scoring.py), told apart the same way.
- score_pairs: which (query, document) pairs a vLLM score request asks for.
- truncated: vLLM's `truncate_prompt_tokens` / `truncation_side` on a list of token ids.
- relevance_logit: a relevance in (0, 1) before vLLM's rerank activation (a sigmoid), for
  `use_activation: false`.
"""

from __future__ import annotations

import math

from prefillonly_sgl.scoring.errors import InvalidRequestError

# Fields only Cohere's v1 rerank API defines: a body carrying one follows Cohere's default.
COHERE_ONLY_RERANK_FIELDS = ("rank_fields", "max_chunks_per_doc")

# vLLM's pairs of score fields, in the order vLLM's request models try them.
VLLM_SCORE_FIELDS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2"))  # fmt: skip
# SGLang's ScoringRequest keys that no vLLM score body has.
SGLANG_SCORE_KEYS = ("query", "label_token_ids")
VLLM_ONLY_SCORE_KEYS = ("queries", "documents", "data_1", "data_2", "text_1", "text_2")


def echoes_documents(return_documents: bool | None, fields_given: set[str]) -> bool:
    """Whether each rerank result carries its document: ``return_documents`` when the
    request gives it; otherwise not for a request carrying a field only Cohere's API has
    (Cohere's default: no document), and yes for any other (vLLM's convention: its
    clients' response model requires `document`; Jina's default is to echo too)."""
    if return_documents is not None:
        return return_documents
    return not any(name in fields_given for name in COHERE_ONLY_RERANK_FIELDS)


def is_vllm_score_body(body: object) -> bool:
    """A /v1/score body in one of vLLM's shapes: it has a key only vLLM's score requests
    have (`queries`, `documents`, `data_1`, `data_2`, `text_1`, `text_2`) and none of
    SGLang's own (`query`, `label_token_ids`). Anything else is SGLang's (its checks say
    what is missing); `items` alone is SGLang's field."""
    if not isinstance(body, dict) or any(key in body for key in SGLANG_SCORE_KEYS):
        return False
    return any(key in body for key in VLLM_ONLY_SCORE_KEYS)


def is_vllm_generative_score_body(body: object) -> bool:
    """vLLM's score body with `label_token_ids` (generative scoring on a causal LM): a key
    only vLLM's score requests have, `label_token_ids`, and not SGLang's `query`."""
    if not isinstance(body, dict) or "query" in body or "label_token_ids" not in body:
        return False
    return any(key in body for key in VLLM_ONLY_SCORE_KEYS)


def score_fields(body: dict) -> tuple[str, str]:
    """The (first, second) field names of a vLLM score body; InvalidRequestError naming
    what is missing or mixed."""
    present = [(a, b) for a, b in VLLM_SCORE_FIELDS if a in body and b in body]
    if len(present) == 1:
        return present[0]
    if present:
        names = ", ".join(f"{a} + {b}" for a, b in present)
        raise InvalidRequestError(f"give one pair of score fields, not several: {names}")
    for a, b in VLLM_SCORE_FIELDS:
        if a in body or (b in body and b != "items"):
            missing = b if a in body else a
            raise InvalidRequestError(
                f"{missing} is missing: vLLM's score request pairs {a} with {b}"
            )
    raise InvalidRequestError("give queries and documents (or text_1 and text_2)")


def score_pairs(first: str | list[str], second: str | list[str], names=("queries", "documents")
                ) -> list[tuple[str, str]]:  # fmt: skip
    """vLLM's pairing: one query against every document (1:N), or the i-th query with the
    i-th document (N:N). A single text stands for a list of one."""
    a, b = names
    for value, name in ((first, a), (second, b)):
        if not isinstance(value, str | list):
            raise InvalidRequestError(f"{name} must be a text or a list of texts, got {value!r}")
    firsts = [first] if isinstance(first, str) else list(first)
    seconds = [second] if isinstance(second, str) else list(second)
    if not firsts:
        raise InvalidRequestError(f"{a} is empty: give a text or a non-empty list")
    if not seconds:
        raise InvalidRequestError(f"{b} is empty: give a text or a non-empty list")
    if len(firsts) == 1:
        return [(firsts[0], s) for s in seconds]
    if len(firsts) != len(seconds):
        raise InvalidRequestError(
            f"{a} has {len(firsts)} texts and {b} {len(seconds)}: give one text in {a} "
            f"(scored against each of {b}), or as many as {b} (paired in order)"
        )
    return list(zip(firsts, seconds, strict=True))


def truncation_limit(truncate_prompt_tokens: int | None, most: int) -> int | None:
    """The tokens to keep (None: no cut): vLLM's -1 means "as many as fit" (``most``). A
    value over ``most`` is refused, naming the field."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return most
    if truncate_prompt_tokens < 1:
        raise InvalidRequestError(
            f"truncate_prompt_tokens must be a positive integer or -1, got {truncate_prompt_tokens}"
        )
    if truncate_prompt_tokens > most:
        raise InvalidRequestError(
            f"truncate_prompt_tokens is {truncate_prompt_tokens}, but at most {most} tokens "
            "fit this server's prompt here: request a smaller truncation size"
        )
    return truncate_prompt_tokens


def truncated(ids: list[int], limit: int | None, side: str | None = None) -> list[int]:
    """``ids`` cut to ``limit`` tokens: "right" (the default, the tokenizer's side that
    vLLM falls back to) keeps the first ones, "left" the last ones."""
    if limit is None or len(ids) <= limit:
        return ids
    return ids[-limit:] if side == "left" else ids[:limit]


def relevance_logit(relevance: float) -> float:
    """``relevance`` in [0, 1] as the score before a sigmoid (log r - log(1 - r)): what a
    rerank answers with `use_activation: false`, so that sigmoid of it is the relevance,
    as for vLLM's cross-encoders. Clamped away from 0 and 1 (JSON has no infinity)."""
    r = min(max(relevance, 1e-300), 1 - 1e-16)
    return math.log(r) - math.log1p(-r)
