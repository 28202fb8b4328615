"""The setwise readout's checks where prefill-only KV keeps the prefix cache (plain Python).

SGLang 0.5.23's `_validate_score_extraction` refuses a setwise score request (labels read
at every occurrence of score_extraction_token_id) unless the radix cache and chunked
prefill are off, because its readout positions are full-prompt positions. Where
prefill-only KV runs, neither is needed: such a prompt is never chunked and its anchors
are read as rows of what its forward computes (scheduler_process._after_prepare_for_extend),
so for a causal LM the check is SGLang's other two conditions alone, with SGLang's own
messages (a client sees one server). A classification head's setwise request (an
embedding request, whose pooling positions nothing here moves) and every engine without
prefill-only KV keep SGLang's whole check (tokenizer_process._around_validate_score_extraction).
"""

from __future__ import annotations

# SGLang 0.5.23's messages (tokenizer_manager_score_mixin._validate_score_extraction)
ITEM_FIRST = "item_first is not supported with score_extraction_token_id."
AUTO_TRUNCATE = (
    "score_extraction_token_id is not supported with --allow-auto-truncate: pooling "
    "positions are computed from the full prompt, and truncating the sequence would leave "
    "them pointing past the truncated length."
)


def setwise_refusal(item_first: bool, allow_auto_truncate: bool) -> str | None:
    """Why a causal LM's setwise request cannot run with the prefix cache kept (None: it
    can)."""
    if item_first:
        return ITEM_FIRST
    if allow_auto_truncate:
        return AUTO_TRUNCATE
    return None
