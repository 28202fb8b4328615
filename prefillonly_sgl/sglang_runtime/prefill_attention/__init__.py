"""Prefill-only attention (plugin feature "prefill_attention"): attention for the new
tokens only, against the cached prefix read from the pool (docs/prefill_attention.md).

    torch_backend.py        the CPU backend (registered under torch_native's name) and
                            ``register()``, which also registers the GPU one
    flashinfer_backend.py   the GPU subclass (FlashInfer's name): what prefill-only KV
                            needs on top of stock FlashInfer
    ../../attention/        the plans and kernels (plain torch / FlashInfer calls)
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.prefill_attention.torch_backend import register

__all__ = ["register"]
