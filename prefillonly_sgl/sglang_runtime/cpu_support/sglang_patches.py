"""Patches applied to SGLang modules right after they load on the CPU support
(``boot.POST_IMPORT_PATCHES``), where SGLang's CPU path assumes a CPU with AMX and
sgl-kernel's CPU build and otherwise falls through to a Triton kernel (CUDA only).

Each takes the freshly loaded module; each is the smallest change that sends the module to
SGLang's own CPU branch, whose ``torch.ops.sgl_kernel`` op sgl_kernel_ops.py provides, or,
where a module calls a CUDA-only PyTorch op, gives that op a CPU kernel in torch.
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


def short_conv_in_torch(module) -> None:
    """``layers.attention.mamba.causal_conv1d`` (the short convolution of LFM2's conv
    layers, and of Granite 4.0 hybrid's Mamba2 mixers) runs sgl-kernel's CUDA kernel or,
    on any other device, a Triton kernel; on a CPU the torch kernels Qwen3.5's short
    convolution runs (linear_attention_kernels.py), with the module's signatures."""
    from sglang.srt.utils import is_cpu

    if not is_cpu():
        return
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

    def causal_conv1d_fn(
        x, weight, bias=None, query_start_loc=None, cache_indices=None,
        has_initial_state=None, conv_states=None, activation="silu", pad_slot_id=-1,
        **unused,
    ):  # fmt: skip
        _check_activation(activation)
        if query_start_loc is None or conv_states is None:
            raise NotImplementedError("causal_conv1d_fn without packed sequences and their "
                                      "conv states has no CPU kernel here")  # fmt: skip
        return kernels.causal_conv1d_varlen(
            x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
            activation is not None,
        )  # fmt: skip

    def causal_conv1d_update(
        x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
        conv_state_indices=None, pad_slot_id=-1,
    ):  # fmt: skip
        _check_activation(activation)
        if cache_seqlens is not None:
            raise NotImplementedError("causal_conv1d_update with cache_seqlens (a circular "
                                      "conv state) has no CPU kernel here")  # fmt: skip
        return kernels.causal_conv1d_step(
            x, conv_state, weight, bias, activation is not None, conv_state_indices
        )

    module.causal_conv1d_fn = causal_conv1d_fn
    module.causal_conv1d_update = causal_conv1d_update


def _check_activation(activation) -> None:
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")


# Kept alive for the process: the CPU kernel of aten._flash_attention_forward (below).
_ATEN_CPU_LIBRARY = None


def flash_attention_on_cpu(module) -> None:
    """``layers.joint_schema_head`` (Clef decision checkpoints' head) attends over packed
    variable-length sequences with ``torch.ops.aten._flash_attention_forward``, which
    PyTorch implements for CUDA only; on CPU it gets a torch kernel of the same op
    (varlen_attention_forward), registered for the CPU dispatch key only."""
    global _ATEN_CPU_LIBRARY
    import torch
    from sglang.srt.utils import is_cpu

    if not is_cpu() or _ATEN_CPU_LIBRARY is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("_flash_attention_forward", varlen_attention_forward, "CPU")
    _ATEN_CPU_LIBRARY = library


def varlen_attention_forward(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    block_table=None,
    num_splits=None,
):
    """``aten._flash_attention_forward`` in torch, for the case SGLang's joint schema head
    calls: packed sequences ([tokens, heads, head_dim] with cumulative offsets), full
    (non-causal) attention, no dropout. Returns (output, logsumexp [heads, tokens], and
    the op's three unused outputs, empty). Anything else is refused, not approximated."""
    import torch

    unsupported = {
        "dense (un-packed) inputs": cum_seq_q is None or cum_seq_k is None,
        "dropout": dropout_p != 0.0,
        "causal attention": is_causal,
        "a debug mask": return_debug_mask,
        "sliding windows": window_size_left is not None or window_size_right is not None,
        "seqused_k / alibi / block_table": any(
            x is not None for x in (seqused_k, alibi_slopes, block_table)
        ),
    }
    refused = [name for name, used in unsupported.items() if used]
    if refused:
        raise NotImplementedError(
            "aten._flash_attention_forward on CPU (prefillonly_sgl's torch kernel) "
            f"does not support {', '.join(refused)}"
        )
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    output = torch.zeros_like(query)
    logsumexp = torch.full((query.shape[1], query.shape[0]), float("-inf"), dtype=torch.float32)
    bounds_q, bounds_k = cum_seq_q.tolist(), cum_seq_k.tolist()
    for q0, q1, k0, k1 in zip(bounds_q, bounds_q[1:], bounds_k, bounds_k[1:]):
        if q1 == q0 or k1 == k0:
            continue  # no keys: flash attention's output is zero there too
        q = query[q0:q1].transpose(0, 1).float()  # [heads, q, d]
        k = key[k0:k1].transpose(0, 1).float()
        v = value[k0:k1].transpose(0, 1).float()
        scores = torch.matmul(q, k.transpose(1, 2)) * scale
        lse = torch.logsumexp(scores, dim=-1)  # [heads, q]
        out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v)
        output[q0:q1] = out.transpose(0, 1).to(output.dtype)
        logsumexp[:, q0:q1] = lse
    empty = query.new_empty(0)
    return output, logsumexp, empty, empty, empty
