"""A whole decoder layer in query chunks (plain torch): hybrid prefilling the paper's way.

Token-wise chunking (chunking.py) leaves attention whole, and with it everything
attention's inputs and outputs need for every token at once: the residual stream and its
normed copy, q / k / v, the kernel's output, the output projection (~3,800 values per
token for SmolLM2, ~22,500 for Llama-3.1-8B shapes). Here one layer runs chunk by chunk
over the batch's rows, each chunk all the way through:

    x[c] -> input norm -> qkv -> rotary -> k / v into the layer's whole K / V buffers
         -> attention of the chunk's queries against every key so far (`attend`)
         -> o_proj -> x[c] += (post-attention norm's fused add) -> MLP -> x[c] += mlp

so that only the residual stream x (updated in place) and the layer's K / V exist for
every token: hidden + 2 x kv_dim values per token (SmolLM2 960, ~8x less than the
unchunked layer; Llama-3.1-8B 6,144, ~9x). A chunk needs the keys of earlier rows only,
so one pass in order computes the layer exactly.

The layer keeps SGLang's own modules (the projections, norms, rotary embedding and MLP,
with their kernels and quantisation); only the order of the calls is ours. Handled: the
Llama / Qwen2 layer shape (`is_chunkable_layer`). The residual stream enters whole and
complete (x = the previous layer's output + residual) and leaves the same way; the
values equal SGLang's unchunked layer in float32 (the same additions in the same order:
x + a == a + x); in 16-bit formats the next layer's input norm reads the rounded sum
where SGLang's fused add reads it unrounded, a rounding-level difference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges

# Decoder layers whose forward is: input norm -> self_attn(qkv, rotary, attn, o_proj) ->
# post-attention norm with the residual add -> MLP, and nothing else.
LAYER_CLASSES = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "MistralDecoderLayer")
_ATTENTION_PARTS = ("qkv_proj", "rotary_emb", "attn", "o_proj", "q_size", "kv_size")
# Extras some layers of these shapes add that this forward would skip (Qwen3's q / k
# norms, Gemma-style sandwich norms, cross-layer caches).
_UNHANDLED_PARTS = ("q_norm", "k_norm", "pre_feedforward_layernorm", "post_feedforward_layernorm")

# attend(q, k_all, v_all, start, end) -> (end - start, q_heads * v_head_dim)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def is_chunkable_layer(layer: nn.Module) -> bool:
    attn = getattr(layer, "self_attn", None)
    return (
        type(layer).__name__ in LAYER_CLASSES
        and attn is not None
        and all(hasattr(attn, part) for part in _ATTENTION_PARTS)
        and not any(hasattr(attn, part) or hasattr(layer, part) for part in _UNHANDLED_PARTS)
        and all(hasattr(layer, m) for m in ("input_layernorm", "post_attention_layernorm", "mlp"))
        # a float32 residual beside 16-bit activations is not the one stream kept here
        and not getattr(layer.post_attention_layernorm, "fp32_residual", False)
    )


def kv_buffers(x: torch.Tensor, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's whole K and V, (T, kv_heads, head_dim): the only per-token buffers
    besides x. Shaped like the attention layer's k / v views."""
    radix = layer.self_attn.attn
    n = x.shape[0]
    k = x.new_empty((n, radix.tp_k_head_num, radix.qk_head_dim))
    v = x.new_empty((n, radix.tp_v_head_num, radix.v_head_dim))
    return k, v


def run_layer_in_chunks(
    layer: nn.Module,
    positions: torch.Tensor,
    x: torch.Tensor,
    chunk: int,
    attend: Attend,
    mlp_kwargs: dict | None = None,
) -> torch.Tensor:
    """The layer over x's rows, `chunk` rows at a time; x (the complete residual stream,
    (T, hidden)) is updated in place and returned."""
    attn = layer.self_attn
    k_all, v_all = kv_buffers(x, layer)
    mlp_kwargs = mlp_kwargs or {}
    for start, end in chunk_ranges(x.shape[0], chunk):
        rows = x[start:end]
        qkv, _ = attn.qkv_proj(layer.input_layernorm(rows))
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions[start:end], q, k)
        k_all[start:end] = k.view(end - start, *k_all.shape[1:])
        v_all[start:end] = v.view(end - start, *v_all.shape[1:])
        del qkv, k, v
        o = attend(q, k_all, v_all, start, end)
        del q
        o, _ = attn.o_proj(o)
        normed, summed = layer.post_attention_layernorm(o, rows)
        if summed.data_ptr() != rows.data_ptr():  # CUDA's fused add writes it in place
            rows.copy_(summed)
        del o, summed
        rows.add_(layer.mlp(normed, **mlp_kwargs))
    return x
