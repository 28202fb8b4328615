"""Hybrid prefilling (feature "hybrid_prefill"): a long prompt runs in chunks, so its peak
activation memory drops and its scores stay the same (docs/hybrid_prefill.md).

    layer_chunks.py        a whole decoder layer in query chunks (mode "layer", the
                           default: only the residual stream and one layer's K/V whole)
    chunking.py            the token-wise modules (MLPs, norms, rotary) chunk by chunk
                           (mode "token", and inside the layers); plain torch
    settings.py            modes and chunk sizes, as the scheduler process receives them
    scheduler_process.py   applies them to the loaded model in the scheduler
"""

from __future__ import annotations


def register() -> None:
    """Plugin entry (every SGLang process; acts in the scheduler, where the model loads)."""
    from prefillonly_sgl.features.hybrid_prefill import scheduler_process
    from prefillonly_sgl.hooking.hooks import register_hooks

    register_hooks("hybrid_prefill.scheduler_process", scheduler_process.HOOKS)
