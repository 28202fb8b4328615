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
    layers) runs sgl-kernel's CUDA kernel or, on any other device, a Triton kernel; on a
    CPU the torch kernels Qwen3.5's short convolution runs (linear_attention_kernels.py),
    with the module's signatures."""
    from sglang.srt.utils import is_cpu

    if is_cpu():
        module.causal_conv1d_fn = causal_conv1d_fn
        module.causal_conv1d_update = causal_conv1d_update


def mamba2_in_torch(module) -> None:
    """``layers.attention.mamba.mamba`` (the Mamba2 mixer: Granite 4.0 hybrid's, among
    others) binds its convolution only on CUDA, NPU and XPU (on a CPU the names are
    missing: NameError) and scans with Triton kernels; on a CPU, torch kernels of the same
    math with the mixer's signatures (linear_attention_kernels.py: ssd_varlen, ssd_step)."""
    from sglang.srt.utils import is_cpu

    if not is_cpu():
        return
    for name in ("causal_conv1d_fn", "causal_conv1d_fn_triton"):
        setattr(module, name, causal_conv1d_fn)
    for name in ("causal_conv1d_update", "causal_conv1d_update_triton"):
        setattr(module, name, causal_conv1d_update)
    module.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    module.selective_state_update = selective_state_update


def causal_conv1d_fn(
    x, weight, bias=None, query_start_loc=None, cache_indices=None, has_initial_state=None,
    conv_states=None, activation="silu", pad_slot_id=-1, **unused,
):  # fmt: skip
    """SGLang's causal_conv1d_fn (packed sequences, x [dim, tokens]) in torch."""
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

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
    conv_state_indices=None, pad_slot_id=-1, **unused,
):  # fmt: skip
    """SGLang's causal_conv1d_update (one token per row) in torch."""
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

    _check_activation(activation)
    if cache_seqlens is not None or unused.get("intermediate_conv_window") is not None:
        raise NotImplementedError("causal_conv1d_update with a circular conv state or "
                                  "speculative windows has no CPU kernel here")  # fmt: skip
    return kernels.causal_conv1d_step(
        x, conv_state, weight, bias, activation is not None, conv_state_indices
    )


def mamba_chunk_scan_combined(
    x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
    seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
    dt_softplus=False, dt_limit=(0.0, float("inf")), out=None, return_final_states=False,
    return_varlen_states=False, return_intermediate_states=False, state_dtype=None,
    return_track_states=False, track_seq_idx=None, track_end_locs=None,
):  # fmt: skip
    """SGLang's mamba_chunk_scan_combined in its varlen form, as the Mamba2 mixer calls it
    (one packed batch, cu_seqlens, the varlen states returned), in torch. The Triton
    kernel's per-chunk states (for SGLang's state tracking, extra_buffer: GPU only) are
    not produced."""
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

    if z is not None or not return_varlen_states or return_final_states:
        raise NotImplementedError("mamba_chunk_scan_combined on CPU: the varlen form "
                                  "without z only (the Mamba2 mixer's call)")  # fmt: skip
    if track_seq_idx is not None:
        raise NotImplementedError("Mamba2 state tracking (extra_buffer) is GPU-only")
    finals = kernels.ssd_varlen(
        x[0], dt[0], A, B[0], C[0], chunk_size, D, dt_bias, initial_states, cu_seqlens,
        dt_softplus, dt_limit, out[0],
    )  # fmt: skip
    varlen = finals.to(state_dtype) if state_dtype is not None else finals
    if return_track_states:
        return None, varlen, None
    return (None, varlen) if return_intermediate_states else varlen


def selective_state_update(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
    state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
    **unused,
):  # fmt: skip
    """SGLang's selective_state_update (decode: one token per row) in torch."""
    from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels

    if disable_state_update or unused.get("intermediate_states_buffer") is not None:
        raise NotImplementedError("speculative target-verify of a Mamba2 layer has no CPU "
                                  "kernel here")  # fmt: skip
    return kernels.ssd_step(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out
    )


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
