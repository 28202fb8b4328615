"""transformers' Llama run with the project's hybrid prefilling by whole layers (plain torch).

`features/hybrid_prefill/layer_chunks.run_layer_in_chunks` drives SGLang's decoder layer:
a fused qkv projection, rotary as rope(positions, q, k), an o_proj and a fused
add-and-norm that return (output, bias) / (normed, sum). A lent GPU machine has no SGLang,
so benchmarks/gpu_prefill.py builds an 8B-shaped Llama with transformers and shows its
layers to run_layer_in_chunks through that interface: the same modules and weights, only
the call shapes adapted (no weight is copied; the q / k / v projections run separately and
are concatenated per chunk).

    logits = hybrid_forward(model, ids, chunk, attend_for_layer)     # (1, vocab), last token
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from prefillonly_sgl.features.hybrid_prefill.layer_chunks import Attend, run_layer_in_chunks


class _RadixShape:
    """The head counts and dims run_layer_in_chunks reads off SGLang's RadixAttention."""

    def __init__(self, kv_heads: int, head_dim: int) -> None:
        self.tp_k_head_num = self.tp_v_head_num = kv_heads
        self.qk_head_dim = self.v_head_dim = head_dim


class _Attention:
    def __init__(self, attention, rotary, heads: int, kv_heads: int) -> None:
        self._attention = attention
        self._rotary = rotary
        self.head_dim = attention.head_dim
        self.heads, self.kv_heads = heads, kv_heads
        self.q_size, self.kv_size = heads * self.head_dim, kv_heads * self.head_dim
        self.attn = _RadixShape(kv_heads, self.head_dim)

    def qkv_proj(self, x):
        a = self._attention
        return torch.cat([a.q_proj(x), a.k_proj(x), a.v_proj(x)], dim=-1), None

    def rotary_emb(self, positions, q, k):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        n, d = positions.shape[0], self.head_dim
        q4 = q.view(1, n, self.heads, d).transpose(1, 2)
        k4 = k.reshape(1, n, self.kv_heads, d).transpose(1, 2)
        cos, sin = self._rotary(q4, positions[None])
        q4, k4 = apply_rotary_pos_emb(q4, k4, cos, sin)
        return q4.transpose(1, 2).reshape(n, -1), k4.transpose(1, 2).reshape(n, -1)

    def o_proj(self, o):
        return self._attention.o_proj(o), None


class _AddNorm:
    """post_attention_layernorm(o, residual) -> (norm(o + residual), o + residual)."""

    def __init__(self, norm) -> None:
        self._norm = norm

    def __call__(self, o, residual):
        summed = o + residual
        return self._norm(summed), summed


class SGLangShapedLayer:
    """One transformers LlamaDecoderLayer as run_layer_in_chunks calls SGLang's."""

    def __init__(self, layer, rotary, config) -> None:
        self.self_attn = _Attention(
            layer.self_attn, rotary, config.num_attention_heads, config.num_key_value_heads
        )
        self.input_layernorm = layer.input_layernorm
        self.post_attention_layernorm = _AddNorm(layer.post_attention_layernorm)
        self.mlp = layer.mlp


@torch.no_grad()
def hybrid_forward(
    model, ids: torch.Tensor, chunk: int, attend_for_layer: Callable[[int], Attend]
) -> torch.Tensor:
    """Last-token logits of a cold prefill of `ids` (T,), every decoder layer run in query
    chunks of `chunk` rows: only the residual stream and one layer's K / V whole."""
    inner = model.model
    x = inner.embed_tokens(ids)
    positions = torch.arange(ids.shape[0], device=ids.device)
    for index, layer in enumerate(inner.layers):
        shaped = SGLangShapedLayer(layer, inner.rotary_emb, model.config)
        run_layer_in_chunks(shaped, positions, x, chunk, attend_for_layer(index))
    return model.lm_head(inner.norm(x[-1:]))


@torch.no_grad()
def plain_forward(model, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own forward, no cache, logits of the last position only."""
    return model(ids[None], use_cache=False, logits_to_keep=1).logits[0]
