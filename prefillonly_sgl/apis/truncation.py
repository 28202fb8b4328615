"""Per-document truncation for the rerank APIs (plain Python).

The rule: a document longer than its limit keeps its first ``limit`` tokens (TEI's
truncation_direction "Left": its last), counted as the tokenizer splits the document on
its own (no special tokens), decoded back to text at that token boundary. Two limits:

- ``max_tokens_per_doc`` (Cohere v2's field; /v1/rerank takes it too): the caller's cut.
- what fits: the engine's longest prompt less the ranker's prompt around the document
  (its tokens with an empty document, and a few for tokens merging at the joins). A
  document over it is cut when the caller asked for that (TEI's ``truncate: true``) and
  is a 400 naming it otherwise.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.errors import InvalidRequestError

JOIN_SLACK = 8  # tokens a document's edges may add when merged into the prompt


def cut(tokenizer, text: str, limit: int, keep_end: bool = False) -> str:
    """``text`` cut to ``limit`` tokens (its start, or its end with keep_end)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= limit:
        return text
    return tokenizer.decode(ids[-limit:] if keep_end else ids[:limit])


def fit_documents(
    tokenizer,
    documents: list[str],
    room: int,
    max_tokens_per_doc: int | None = None,
    truncate: bool = False,
    keep_end: bool = False,
    field: str = "documents",
    how_to_cut: str = "max_tokens_per_doc",
) -> list[str]:
    """The documents as the ranker will see them. ``room``: tokens a document may take in
    the prompt (what fits). InvalidRequestError for a document over ``room`` unless
    ``truncate``, naming it as ``field[i]`` (the request's field) and ``how_to_cut``."""
    if room < 1:
        raise InvalidRequestError(
            "the query and the ranker's prompt already fill the model's context: shorten the query"
        )
    fitted = []
    for i, document in enumerate(documents):
        if max_tokens_per_doc is not None:
            document = cut(tokenizer, document, max_tokens_per_doc, keep_end)
        n = len(tokenizer.encode(document, add_special_tokens=False))
        if n > room:
            if not truncate:
                raise InvalidRequestError(
                    f"{field}[{i}] is {n} tokens; with the query and the ranker's prompt "
                    f"at most {room} fit (shorten it, or cut it: {how_to_cut})"
                )
            document = cut(tokenizer, document, room, keep_end)
        fitted.append(document)
    return fitted
