"""The ``torch.ops.sgl_kernel`` ops SGLang's CPU path binds for hybrid linear-attention
models, registered with torch implementations (linear_attention_kernels.py).

``sglang/srt/models/qwen3_5.py`` binds four of them at import when ``is_cpu()``, and the
Gated DeltaNet backend (``layers/attention/linear/gdn_backend.py``, ``kernels/gdn_triton.py``)
two more; without them Qwen3.5 does not import. Schemas are sgl-kernel's own (its CPU
build's ``torch_extension_cpu.cpp``), so a real CPU build of sgl-kernel, when installed,
keeps its kernels: an op that already exists is left alone. Called once by
``boot._ShimLoader`` right after the ``sgl_kernel`` stand-in loads, i.e. before any SGLang
module can bind the names.
"""

from __future__ import annotations

import torch

from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

_LIBRARY: torch.library.Library | None = None


def _fused_sigmoid_mul(x, gate):
    kernels.sigmoid_mul_(x, gate)


def _fused_sigmoid_gating_delta_rule_update(
    A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices, cu_seqlens,
    use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold,
):  # fmt: skip
    del cu_seqlens  # one token per sequence
    return kernels.gated_delta_rule_decode(
        A_log, dt_bias, q, k, v, a, b, initial_state_source, initial_state_indices,
        use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold,
    )  # fmt: skip


OPS = {
    "fused_rmsnorm_gated_cpu(Tensor input, Tensor weight, Tensor gate, float eps) "
    "-> Tensor": kernels.rmsnorm_gated,
    "fused_sigmoid_mul_cpu(Tensor(a!) input, Tensor gate) -> ()": _fused_sigmoid_mul,
    "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, "
    "float eps, int head_dim) -> (Tensor, Tensor)": kernels.qk_gemma_rmsnorm,
    "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, "
    "Tensor k_weight, float eps, int head_dim, int num_head) -> (Tensor, Tensor, Tensor)": (
        kernels.qk_gemma_rmsnorm_with_gate
    ),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, "
    "int num_heads_qk, int num_heads_v, int head_qk, int head_v) "
    "-> (Tensor, Tensor, Tensor, Tensor)": kernels.qkvzba_split_contiguous,
    "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) "
    "-> (Tensor, Tensor)": kernels.gdn_gating,
    "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, "
    "Tensor k, Tensor v, Tensor a, Tensor b, Tensor(a!) initial_state_source, "
    "Tensor initial_state_indices, Tensor cu_seqlens, bool use_qk_l2norm_in_kernel, "
    "float softplus_beta, float softplus_threshold) -> Tensor": (
        _fused_sigmoid_gating_delta_rule_update
    ),
}


def register() -> None:
    """Idempotent; defines only the ops the namespace lacks."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("sgl_kernel", "FRAGMENT")
    for schema, function in OPS.items():
        name = schema.split("(", 1)[0]
        if hasattr(torch.ops.sgl_kernel, name):
            continue
        library.define(schema)
        library.impl(name, function, "CPU")
    _LIBRARY = library
