"""``sgl_kernel.mamba`` on the CPU support: the three functions SGLang's CPU path imports
from it for linear-attention layers (``gdn_backend.py``: the short convolution and its
decode step; ``kernels/gdn_triton.py``: the chunked gated delta rule), with sgl-kernel's
signatures and torch implementations (linear_attention_kernels.py). Served as the module
``sgl_kernel.mamba`` by ``boot._CpuImportHook``.

Speculative decoding's target-verify arguments (intermediate conv windows and states) are
refused: prefill-only serving never verifies drafts.
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels


def causal_conv1d_fn_cpu(
    mixed_qkv_transposed,
    conv_weights,
    bias,
    activation,
    conv_states,
    has_initial_state,
    cache_indices,
    query_start_loc,
    seq_lens_cpu=None,
    **unused,
):
    del seq_lens_cpu, unused  # query_start_loc bounds the sequences
    return kernels.causal_conv1d_varlen(
        mixed_qkv_transposed,
        conv_weights,
        bias,
        conv_states,
        query_start_loc,
        cache_indices,
        has_initial_state,
        activation in ("silu", "swish"),
    )


def causal_conv1d_update_cpu(
    mixed_qkv,
    conv_states,
    conv_weights,
    bias,
    activation,
    conv_state_indices,
    intermediate_conv_window=None,
    **unused,
):
    if intermediate_conv_window is not None:
        raise NotImplementedError(
            "speculative target-verify of a linear-attention layer has no CPU kernel here"
        )
    return kernels.causal_conv1d_step(
        mixed_qkv,
        conv_states,
        conv_weights,
        bias,
        activation in ("silu", "swish"),
        conv_state_indices,
    )


def chunk_gated_delta_rule_cpu(
    q,
    k,
    v,
    g,
    beta,
    initial_state,
    cu_seqlens,
    head_first,
    use_qk_l2norm_in_kernel,
    initial_state_indices,
    **unused,
):
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head-first layout")
    out = kernels.chunk_gated_delta_rule_varlen(
        q, k, v, g, beta, initial_state, cu_seqlens, initial_state_indices,
        use_qk_l2norm_in_kernel,
    )  # fmt: skip
    return out, initial_state, None  # the states are updated in place, as sgl-kernel's
