"""Prefill-only attention math, independent of SGLang (plain Python and torch).

- plan.py: how an extend batch is cut into SDPA calls (query blocks, padded groups).
- cpu_extend.py: the CPU kernel, attention of the new tokens only, with PyTorch's
  fused scaled_dot_product_attention.
- query_chunk.py: attention of one query chunk of a batch (hybrid prefilling's layers);
  flashinfer_chunk.py: the same with FlashInfer's ragged prefill on CUDA.

The SGLang backends that use it are in prefillonly_sgl/sglang_runtime/prefill_attention/.
"""
