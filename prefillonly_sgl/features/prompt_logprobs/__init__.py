"""Prompt logprobs through the prefix cache (feature "prompt_logprobs"): echo + logprobs
requests (what evaluation harnesses send) keep each cached token's logprob and top-k in a
side table indexed by KV slot (docs/loglikelihood.md).

    table.py               per KV slot: its token's logprob and its position's top-k
    plan.py                which positions a request reads from the table, the splice
    settings.py            the chunk size of the prompt-logprob computation
    scheduler_process.py   the scheduler hooks
"""

from __future__ import annotations


def register() -> None:
    """Plugin entry (every SGLang process)."""
    from prefillonly_sgl.features.prompt_logprobs import scheduler_process

    scheduler_process.register()
