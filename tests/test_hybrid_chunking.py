"""Hybrid prefilling's transform on plain torch modules (no SGLang): chunked token-wise
modules give the unchunked values for any chunk size and prompt length, keep short inputs
on the original path, and leave the attention-like (token-mixing) modules alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from prefillonly_sgl.features.hybrid_prefill import chunking
from prefillonly_sgl.features.hybrid_prefill.settings import (
    DEFAULT_CHUNK_SIZE,
    LAYER_CHUNK_SIZE,
    HybridSettings,
    whole_limit,
)

HIDDEN, INTERMEDIATE, HEADS, HEAD_DIM = 32, 80, 4, 8


class ToyMLP(nn.Module):  # SGLang's gated MLP: forward(x, forward_batch=None)
    def __init__(self):
        super().__init__()
        self.gate_up_proj = nn.Linear(HIDDEN, 2 * INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)
        self.calls = []

    def forward(self, x, forward_batch=None):
        self.calls.append(x.shape[0])
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class RMSNorm(nn.Module):  # SGLang's: norm(x, residual=None) -> x or (x, residual)
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(HIDDEN) + 0.5)
        self.variance_epsilon = 1e-6

    def forward(self, x, residual=None, post_residual_addition=None):
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.clone()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        x = x * self.weight
        return x if residual is None else (x, residual)


class ToyRotaryEmbedding(nn.Module):  # rope(positions, q, k) -> new (q, k)
    def __init__(self):
        super().__init__()
        angles = torch.arange(512)[:, None] * (0.1 ** torch.arange(HEAD_DIM // 2))[None]
        self.cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1)

    def forward(self, positions, q, k):
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)

        def rotate(x):
            x = x.reshape(x.shape[0], -1, HEAD_DIM)
            a, b = x.chunk(2, dim=-1)
            c, s = cos[:, None], sin[:, None]
            return torch.cat([a * c - b * s, b * c + a * s], dim=-1).flatten(1)

        return rotate(q), rotate(k)


class ToyLayer(nn.Module):
    """Norm, qkv + rotary, attention over all tokens (token-mixing), norm, MLP."""

    def __init__(self, rope):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.qkv = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.rotary_emb, self.mlp = rope, ToyMLP()

    def forward(self, positions, h, residual):
        h, residual = (
            (self.input_layernorm(h), h) if residual is None else self.input_layernorm(h, residual)
        )
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        heads = [t.reshape(t.shape[0], HEADS, HEAD_DIM).transpose(0, 1) for t in (q, k, v)]
        o = nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
        h = self.o_proj(o.transpose(0, 1).flatten(1))
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        rope = ToyRotaryEmbedding()  # one instance shared by the layers, as in SGLang
        self.layers = nn.ModuleList([ToyLayer(rope) for _ in range(2)])
        self.norm = RMSNorm()

    def forward(self, h):
        positions, residual = torch.arange(h.shape[0]), None
        for layer in self.layers:
            h, residual = layer(positions, h, residual)
        return self.norm(h, residual)[0]


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    return ToyModel().eval(), torch.randn(300, HIDDEN)


def test_chunk_ranges_cover_every_token_once():
    assert chunking.chunk_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunking.chunk_ranges(8, 4) == [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match="chunk size must be >= 1"):
        chunking.chunk_ranges(8, 0)


@pytest.mark.parametrize("chunk", [1, 7, 64, 100, 299, 300, 1000])
def test_chunked_model_equals_the_unchunked_one(model_and_input, chunk):
    model, x = model_and_input
    with torch.no_grad():
        want = model(x)
        chunked = chunking.apply(model, chunk)
        try:
            got = model(x)
        finally:
            for module in model.modules():
                chunking.restore(module)
    assert {k: len(v) for k, v in chunked.items()} == {"mlp": 2, "rms_norm": 5, "rotary": 1}
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), (got - want).abs().max()


def test_only_long_inputs_are_chunked_and_restore_undoes_it(model_and_input):
    model, x = model_and_input
    mlp = model.layers[0].mlp
    chunking.apply(model, 128)
    try:
        mlp.calls.clear()
        with torch.no_grad():
            model(x)  # 300 tokens: chunks of 128
            model(x[:50])  # short: the original forward, whole
        assert mlp.calls == [128, 128, 44, 50]
    finally:
        for module in model.modules():
            chunking.restore(module)
    mlp.calls.clear()
    with torch.no_grad():
        model(x)
    assert mlp.calls == [300]


def test_outputs_that_are_not_per_token_are_passed_through():
    bias = torch.ones(3)

    def linear(x):  # SGLang's RowParallelLinear returns (output, bias)
        return x * 2, bias

    out, b = chunking.run_in_chunks(linear, 4, (0,), torch.arange(10.0)[:, None])
    assert b is bias and out[:, 0].tolist() == [2.0 * i for i in range(10)]
    # a None token argument (a norm without residual) stays None in every chunk
    seen = []
    chunking.run_in_chunks(lambda x, r=None: seen.append(r) or x, 4, (0, 1), torch.ones(9, 2), None)
    assert seen == [None, None, None]


def test_settings_and_defaults():
    assert HybridSettings.for_device("cpu") == HybridSettings(LAYER_CHUNK_SIZE["cpu"], "layer")
    assert HybridSettings.for_device("cpu", mode="token").chunk_size == DEFAULT_CHUNK_SIZE["cpu"]
    assert HybridSettings.for_device("cuda", 512).chunk_size == 512
    assert HybridSettings.from_dict({"chunk_size": 96}) == (HybridSettings(96, "layer"))
    settings = HybridSettings(200, "token")
    assert HybridSettings.from_dict(settings.to_dict()) == settings
    with pytest.raises(ValueError, match="mode must be one of layer, token"):
        HybridSettings(200, "attention")
    with pytest.raises(ValueError, match="chunk size must be an integer >= 16"):
        HybridSettings(8)
    with pytest.raises(ValueError, match="whole-up-to must be a positive number of tokens"):
        HybridSettings(64, whole_up_to=0)


def test_which_forwards_run_whole():
    """By default a forward chunks only past the largest batch stock SGLang would build
    (its prefill token budget, its largest prefill graph bucket): on a card the chunked
    path's extra rounds cost more than its memory saves there. An explicit chunk size
    (or whole_up_to) says where chunks start. Plain Python."""
    default = HybridSettings.for_device("cuda")
    assert default.whole_up_to is None
    # SGLang 0.5.23 on an H200: max_prefill_tokens 16384, chunked_prefill_size 8192,
    # breakable graph buckets up to 8192
    assert whole_limit(default, 16384, 8192, [4, 8, 8192]) == 8192
    assert whole_limit(default, 16384, 8192, None) == 8192  # graphs off
    assert whole_limit(default, 4096, -1, None) == 4096  # chunked prefill off
    assert whole_limit(default, None, None, None) == default.chunk_size  # at least a chunk
    assert whole_limit(default, 16384, 8192, [12288]) == 12288  # no bucket captures chunks
    explicit = HybridSettings.for_device("cuda", 512)
    assert explicit.whole_up_to == 512
    assert whole_limit(explicit, 16384, 8192, [8192]) == 512
    assert HybridSettings.for_device("cpu", 64, whole_up_to=1000).whole_up_to == 1000
