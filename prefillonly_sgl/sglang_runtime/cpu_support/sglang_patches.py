"""Patches applied to SGLang modules right after they load on the CPU support
(``boot.POST_IMPORT_PATCHES``), where SGLang's CPU path assumes a CPU with AMX and
sgl-kernel's CPU build and otherwise falls through to a Triton kernel (CUDA only).

Each takes the freshly loaded module; each is the smallest change that sends the module to
SGLang's own CPU branch, whose ``torch.ops.sgl_kernel`` op sgl_kernel_ops.py provides.
"""

from __future__ import annotations


def gated_rmsnorm_on_cpu_kernel(module) -> None:
    """``fla.layernorm_gated.RMSNorm`` and ``fla.fused_norm_gate.FusedRMSNormGated`` (the
    gated norm after a Gated DeltaNet layer: Qwen3.5's, Qwen3-Next's) take their CPU
    branch (``fused_rmsnorm_gated_cpu``) only where ``cpu_has_amx_support()``; elsewhere
    they call a Triton kernel, which asks for a CUDA device."""
    from sglang.srt.utils import is_cpu

    if is_cpu():
        module._use_cpu = True


def shared_expert_gate_in_torch(module) -> None:
    """``models.qwen2_moe`` (Qwen2-MoE, Qwen3.5-MoE) gates the shared expert with a fused
    Triton kernel, sigmoid(hidden . w) * shared (added to the routed experts' output),
    unless the gate runs SGLang's AMX backend; the same math in torch here."""
    from sglang.srt.utils import is_cpu

    if not is_cpu():
        return
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

    module.fused_gate_sigmoid_mul = kernels.gate_sigmoid_mul
    module.fused_gate_sigmoid_mul_add = kernels.gate_sigmoid_mul_add
