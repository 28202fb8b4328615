"""Prefill-only attention (feature "prefill_attention"): attention for the new tokens
only, against the cached prefix read from the pool (docs/prefill_attention.md).

    plan.py                          how an extend batch is cut into SDPA calls (plain)
    cpu_extend.py                    the CPU kernel: new tokens only, fused SDPA (torch)
    query_chunk.py                   one query chunk of a batch (hybrid prefilling's layers)
    layer_keys.py                    the keys such a layer keeps for its later chunks
    flashinfer_chunk.py              the same with FlashInfer's ragged prefill on CUDA
    one_pass.py                      a packed batch as one paged pass per layer (plain)
    flashinfer_one_pass.py           ... made into FlashInfer's paged prefill on CUDA
    scheduler_torch_backend.py       the CPU backend (under torch_native's name, and
                                     intel_amx's / triton's for the models below), in the
                                     scheduler process; registers the GPU one too
    windowed.py                      sliding windows and attention sinks (gpt-oss), CPU
    sink_models.py                   what SGLang is asked for a model with sinks (plain)
    window_models.py                 ... for windows SGLang holds to a GPU backend (EXAONE 4)
    tokenizer_process.py             the main process: those models past SGLang's check
    scheduler_flashinfer_backend.py  the GPU subclass (FlashInfer's name): what prefill-only
                                     KV needs on top of stock FlashInfer
"""

from __future__ import annotations


def register() -> None:
    """Plugin entry (every SGLang process)."""
    from prefillonly_sgl.features.prefill_attention import (
        scheduler_torch_backend,
        tokenizer_process,
    )

    scheduler_torch_backend.register()
    tokenizer_process.install_in_this_process()  # where SGLang resolves its arguments
