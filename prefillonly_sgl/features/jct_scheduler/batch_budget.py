"""How many new tokens one planned batch may hold (plain Python).

Stock SGLang stops a prefill batch at min(max_prefill_tokens, chunked_prefill_size)
tokens (8,192 on a card by default) and chunks a request past it. A batch of whole
one-forward prompts (score prompts, single-token requests: never chunked, never decoded)
has no reason to stop at the chunk size, and on a card a larger forward costs less per
token: SGLang's own multi-item scoring, whose chunked prefill is off, builds 14-15k-token
forwards at 5.3-5.6 us per token where ours stopped at 8k and paid 5.9-6.6 (H200, round 3:
benchmarks/README.md). So on CUDA the JCT scheduler plans batches of such prompts up to
SGLang's max_prefill_tokens (jct_batch_tokens to set another size, up to it), and the
batch's adder lets them in past the chunk size; any other request still stops at the
chunk. On a CPU a forward is compute-bound (a larger one only delays its first
requests), so the budget stays stock's.
"""

from __future__ import annotations

# SGLang 0.5.23's default --max-prefill-tokens (arg_groups/fields/schedule.py)
SGLANG_MAX_PREFILL_TOKENS = 16384


def default_batch_tokens(device: str) -> int | None:
    """The batch budget an engine starts with when none is given: SGLang's default
    max_prefill_tokens on CUDA; None (stock's rule) elsewhere."""
    return SGLANG_MAX_PREFILL_TOKENS if device == "cuda" else None


def batch_token_budget(
    batch_tokens: int | None, max_prefill_tokens: int | None, chunked_prefill_size: int | None
) -> int:
    """The JCT scheduler's token budget per batch: `batch_tokens` bounded by SGLang's
    max_prefill_tokens (its adder admits no more), or, with None, stock's
    min(max_prefill_tokens, chunked_prefill_size) (values <= 0 or None: no limit of
    that kind)."""
    budgets = [b for b in (max_prefill_tokens, chunked_prefill_size) if b and b > 0]
    if batch_tokens is None:
        return min(budgets) if budgets else SGLANG_MAX_PREFILL_TOKENS
    if max_prefill_tokens and max_prefill_tokens > 0:
        return min(batch_tokens, max_prefill_tokens)
    return batch_tokens


def chunk_lift(budget: int, chunked_prefill_size: int | None) -> int:
    """Tokens a batch of whole one-forward prompts may hold beyond SGLang's chunk budget
    (0 where the chunk is off or already as large)."""
    if not chunked_prefill_size or chunked_prefill_size <= 0:
        return 0
    return max(0, budget - chunked_prefill_size)
