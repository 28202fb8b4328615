"""Patches applied to SGLang modules right after they load on the CPU support
(``boot.POST_IMPORT_PATCHES``), where SGLang's CPU path assumes a CPU with AMX and
sgl-kernel's CPU build and otherwise falls through to a Triton kernel (CUDA only).

Each takes the freshly loaded module; each is the smallest change that sends the module to
SGLang's own CPU branch, whose ``torch.ops.sgl_kernel`` op sgl_kernel_ops.py provides.
"""

from __future__ import annotations


def gated_rmsnorm_on_cpu_kernel(module) -> None:
    """``fla.layernorm_gated.RMSNorm`` (the gated norm after a Gated DeltaNet layer) takes
    its CPU branch (``fused_rmsnorm_gated_cpu``) only where ``cpu_has_amx_support()``;
    elsewhere it calls the Triton kernel, which asks for a CUDA device."""
    from sglang.srt.utils import is_cpu

    if is_cpu():
        module._use_cpu = True
