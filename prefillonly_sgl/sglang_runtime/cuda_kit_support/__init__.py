"""SGLang 0.5.23 on a CUDA machine that has no sgl-kernel (the engine kit's card).

The GPU machines lent to this project have torch (CUDA), triton and nvcc but no SGLang,
no sgl-kernel and no network; sgl-kernel's wheel (1.2 GB) cannot travel there
(scripts/gpu_kit/, "the engine kit"). SGLang's CUDA path then needs:

- an importable ``sgl_kernel`` package: CUDA modules import its kernels by name at module
  level (``from sgl_kernel import rmsnorm``, ``from sgl_kernel.kvcacheio import ...``),
  most of them never called on a prefill of a dense model. ``boot`` serves ``sgl_kernel``
  and any ``sgl_kernel.<sub>`` from the CPU support's stand-in (a name resolves; a call of
  a kernel with no stand-in raises NotImplementedError naming it);
- every fused op (RMSNorm, SiluAndMul, rotary, ...) on its pure-torch path:
  ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` (SGLang's own switch), since their preferred
  CUDA backend is sgl-kernel's;
- SGLang's start-up check of sgl-kernel's version skipped
  (``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``);
- SGLang's Python radix tree (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``): its Rust
  one is built against torch 2.14 and the card has torch 2.11;
- FlashInfer's FA2 prefill where the installed FlashInfer lacks FA3's sources: its
  "auto" backend picks FA3 on Hopper, whose JIT build would fail on the kit's trimmed
  FlashInfer (``boot`` wraps ``flashinfer.utils.determine_attention_backend`` then);
- no CuTe DSL dual GEMM where nvidia-cutlass-dsl is absent: SGLang's Qwen2/Qwen3 MLPs
  import that Blackwell decode kernel's module while they are built on CUDA (the first
  card run's scheduler failed there).

Both are patches applied right after their module loads (``boot.POST_IMPORT_PATCHES``).

A user with a normal CUDA install (stock ``sglang`` with sgl-kernel and flashinfer) never
activates this: the engine kit's installer writes a ``sitecustomize.py`` that runs
``boot`` in every interpreter started with the kit's site folder on PYTHONPATH (SGLang's
spawned scheduler and detokenizer included).
"""
