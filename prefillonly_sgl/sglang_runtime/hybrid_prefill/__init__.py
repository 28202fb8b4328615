"""Hybrid prefilling (plugin feature "hybrid_prefill"): the token-wise modules of the loaded
model (MLPs, RMSNorms, rotary embeddings) run over a long prompt's tokens in chunks,
attention over all of them at once.

    hybrid/chunking.py       the transform (plain torch)
    hybrid/settings.py       the chunk size, to the scheduler
    scheduler_process.py     applies the transform once the model is loaded
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.hooks import register_hooks


def register() -> None:
    """Plugin entry (every SGLang process; acts in the scheduler, where the model loads)."""
    from prefillonly_sgl.sglang_runtime.hybrid_prefill import scheduler_process

    register_hooks("hybrid_prefill.scheduler_process", scheduler_process.HOOKS)
