"""Pure-torch stand-in for the two ``sgl_kernel`` entry points SGLang's CPU path imports
(and for every ``sgl_kernel`` name on the engine kit's card: cuda_kit_support/).

There is no CPU build of sgl-kernel on PyPI. ``sglang/srt/mem_cache/allocation.py`` and
``sglang/kernels/ops/kvcache/cache_move.py`` import these names unconditionally when
``is_cpu()``; every other layer falls back to its ``forward_native`` path because no
``torch.ops.sgl_kernel`` ops are registered. Served as the module ``sgl_kernel`` by
``boot._CpuImportHook``.

SGLang also imports other kernels by name at module level on the CPU path (e.g. the
speculative-decoding helpers) without calling them for plain prefill; those names resolve
to a function that raises NotImplementedError only if actually called.

On the engine kit's card one more is called: ``weak_ref_tensor``, which SGLang's default
("breakable") prefill CUDA graphs use to hold their eager calls' arguments (without it
every graph capture failed, H200 2026-11-27).
"""

from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+prefillonly-cpu-shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req, start:end] = the next (end - start) slots of out_cache_loc,
    requests consuming out_cache_loc in order (the Triton kernel's semantics)."""
    del pool_len  # implied by req_to_token's shape
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    consumed = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[consumed : consumed + n].to(req_to_token.dtype)
        consumed += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every per-layer buffer (base address data_ptrs[i], one token slot = strides[i]
    bytes) copy slot src_loc[j] to slot tgt_loc[j]. Rare (KV moves), so a plain loop."""
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in zip(tgt_loc.tolist(), src_loc.tolist()):
            ctypes.memmove(base + tgt * stride, base + src * stride, stride)


def is_arch_support_pdl() -> bool:
    """sgl_kernel.utils' question (programmatic dependent launch): kernels launched
    without sgl-kernel never use it."""
    return False


# A same-sized integer type per element size: __cuda_array_interface__ speaks numpy's
# type strings, which have no bfloat16; the view back to the tensor's dtype is free.
_RAW_TYPES = {
    1: ("|u1", torch.uint8),
    2: ("<i2", torch.int16),
    4: ("<i4", torch.int32),
    8: ("<i8", torch.int64),
}


class _BorrowedCudaMemory:
    """The memory of a CUDA tensor described without owning it (__cuda_array_interface__
    version 2: no stream, so torch neither waits nor syncs, which a graph capture forbids)."""

    def __init__(self, tensor: torch.Tensor, typestr: str) -> None:
        size = tensor.element_size()
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape),
            "strides": tuple(stride * size for stride in tensor.stride()),
            "typestr": typestr,
            "data": (tensor.data_ptr(), False),
            "version": 2,
        }


def weak_ref_tensor(tensor):
    """sgl-kernel's weak_ref_tensor: a tensor over `tensor`'s memory that does not keep it
    alive (SGLang's breakable prefill CUDA graphs hold their eager calls' arguments this
    way, so the graph's memory pool can reuse them). On a CUDA tensor, a tensor built from
    the memory's __cuda_array_interface__ (it keeps only the description alive); anything
    else (a CPU tensor, an empty one, an element size numpy has no integer for) is returned
    as is: a strong reference, which is correct and only holds the memory longer."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda or tensor.numel() == 0:
        return tensor
    raw = _RAW_TYPES.get(tensor.element_size())
    if raw is None:
        return tensor
    typestr, raw_dtype = raw
    borrowed = torch.as_tensor(_BorrowedCudaMemory(tensor, typestr), device=tensor.device)
    assert borrowed.dtype == raw_dtype and borrowed.data_ptr() == tensor.data_ptr()
    return borrowed if tensor.dtype == raw_dtype else borrowed.view(tensor.dtype)


class _Unavailable:
    """A kernel (or a constant's namespace, such as scalar_type.scalar_types) that only
    exists as a name: its attributes are further such names, calling it raises. SGLang's
    CUDA modules read some at import (``scalar_types.uint4b8``) without using them on a
    dense model's prefill."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self.__name__} has no implementation without an sgl-kernel build "
            "(prefillonly-sgl's stand-in, CPU or the engine kit's card); this SGLang "
            "feature needs the CUDA install (README: 'Running on a GPU')."
        )

    def __repr__(self) -> str:
        return f"<sgl_kernel.{self.__name__}: no implementation here>"


def __getattr__(name: str):
    if name.startswith("__"):  # module protocol lookups (__path__, __file__, ...)
        raise AttributeError(name)
    return _Unavailable(name)
