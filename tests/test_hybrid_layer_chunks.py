"""Whole layers in query chunks (features/hybrid_prefill/layer_chunks.py) on plain torch
layers, no SGLang: which layers qualify and why not, how a call's arguments are cut per
slice, and that a layer's own forward run slice by slice, its attention redirected to a
query chunk, gives the whole forward's values for chunk sizes that do and do not divide
the batch, in the "pair" and "plain" residual conventions (SGLang's layer-boundary
convention runs on the engine: tests/test_model_families.py)."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from prefillonly_sgl.features.hybrid_prefill import layer_chunks
from prefillonly_sgl.features.hybrid_prefill.layer_chunks import (
    PAIR,
    PLAIN,
    STREAM,
    CallSlicer,
    QueryChunkSlot,
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8
BATCH = SimpleNamespace(name="forward_batch")  # passed whole, never read here


class RadixAttention(nn.Module):
    """SGLang's attention module as the layers call it: causal over the whole batch (one
    request), with optional per-head sinks (gpt-oss)."""

    def __init__(self, **overrides) -> None:
        super().__init__()
        self.tp_q_head_num, self.tp_k_head_num, self.tp_v_head_num = HEADS, KV_HEADS, KV_HEADS
        self.qk_head_dim = self.v_head_dim = HEAD_DIM
        self.scaling = HEAD_DIM**-0.5
        self.layer_id = 0
        self.attn_type = "decoder"
        self.is_cross_attention = False
        self.logit_cap = 0.0
        self.use_irope = False
        self.__dict__.update(overrides)

    def forward(self, q, k, v, forward_batch, save_kv_cache=True, sinks=None):
        n = q.shape[0]
        return naive_attention(q, k.view(n, KV_HEADS, -1), v.view(n, KV_HEADS, -1), 0, n, sinks)


def naive_attention(q, k_all, v_all, start, end, sinks=None):
    """Rows [start, end)'s queries against keys [0, end), causal; (rows, H * D)."""
    n = end - start
    q = q.view(n, HEADS, HEAD_DIM).float()
    k = k_all[:end].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v_all[:end].float().repeat_interleave(HEADS // KV_HEADS, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * HEAD_DIM**-0.5
    rows = torch.arange(start, end)[:, None]
    logits = logits.masked_fill(torch.arange(end)[None, :] > rows, -math.inf)
    if sinks is not None:  # a per-head logit in the softmax that attends to nothing
        logits = torch.cat([logits, sinks[:, None, None].expand(-1, n, 1)], dim=-1)
    weights = logits.softmax(-1)[..., :end]
    return torch.einsum("hqk,khd->qhd", weights, v).reshape(n, HEADS * HEAD_DIM)


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Attention(nn.Module):
    """q / k norms and a position-dependent (rotary-like) factor: token-wise all."""

    def __init__(self, sinks: bool = False, **overrides) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN)
        self.attn = RadixAttention(**overrides)
        self.sinks = nn.Parameter(torch.randn(HEADS)) if sinks else None

    def forward(self, positions, hidden_states, forward_batch):
        q, k, v = self.qkv_proj(hidden_states).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1
        )
        angle = torch.cos(positions.reshape(-1, 1).float() / 7)
        q, k = rms(q) * angle, rms(k) * angle
        extra = {} if self.sinks is None else {"sinks": self.sinks}
        return self.o_proj(self.attn(q, k, v, forward_batch, **extra))


class PairLayer(nn.Module):
    """Granite / Gemma 3's convention: (hidden, residual) in and out, a multiplier."""

    def __init__(self, **attention) -> None:
        super().__init__()
        self.self_attn = Attention(**attention)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 64), nn.SiLU(), nn.Linear(64, HIDDEN))

    def forward(
        self, positions, hidden_states, forward_batch, residual=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
        else:
            residual = hidden_states + residual
        h = self.self_attn(positions, rms(residual), forward_batch) * 0.5
        residual = residual + h
        return self.mlp(rms(residual)) * 0.5, residual


class PlainLayer(nn.Module):
    """OLMo 2's convention: the complete stream in and out, post-norms."""

    def __init__(self, **attention) -> None:
        super().__init__()
        self.self_attn = Attention(**attention)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 64), nn.SiLU(), nn.Linear(64, HIDDEN))

    def forward(self, positions, hidden_states, forward_batch) -> torch.Tensor:
        x = hidden_states + rms(self.self_attn(positions, hidden_states, forward_batch))
        return x + rms(self.mlp(x))


class BoundaryLayer(PlainLayer):  # SGLang's layer-boundary layers have these
    attn_boundary = ffn_boundary = object()


def chunked(layer, chunk: int):
    """The layer's forward run in query chunks as the scheduler installs it (minus the
    SGLang parts: the backend, whose forward_query_chunk is naive_attention here)."""
    plan = layer_chunks.plan_layer(layer)
    assert not isinstance(plan, str), plan
    original = layer.forward
    slot = QueryChunkSlot()
    layer_chunks.redirect_attention(plan.attention, slot)

    def forward(*args, **kwargs):
        bound = plan.signature.bind(*args, **kwargs)
        n = bound.arguments["hidden_states"].shape[0]
        slicer = CallSlicer(bound, n, ("hidden_states", "residual", "forward_batch"))
        assert slicer.refusal is None
        stream = layer_chunks.torch_stream(plan.convention, bound)
        keys, values = [], []  # the backend's part: every slice's k / v, for later slices

        def attend(q, k, v, start, end, sinks=None):
            assert k.shape == (end - start, KV_HEADS, HEAD_DIM) and v.shape == k.shape
            keys.append(k)
            values.append(v)
            return naive_attention(q, torch.cat(keys), torch.cat(values), start, end, sinks)

        return layer_chunks.run_slices(original, slicer, stream, slot, chunk, attend)

    return forward


@pytest.mark.parametrize("chunk", [5, 8, 16, 40])
@pytest.mark.parametrize("sinks", [False, True], ids=["plain-attention", "sinks"])
def test_pair_layers_in_query_chunks_equal_the_whole_forward(chunk, sinks):
    torch.manual_seed(0)
    layers = [PairLayer(sinks=sinks) for _ in range(2)]
    n = 32  # chunk 8 and 16 divide it, 5 does not, 40 is one slice
    x = torch.randn(n, HIDDEN)
    positions = torch.arange(n)
    with torch.no_grad():
        h, r = x.clone(), None
        for layer in layers:
            h, r = layer(positions, h, BATCH, r)
        want = h + r
        # Gemma 3 passes positions as (1, T): cut along the token dimension all the same
        h, r = x.clone(), None
        for layer in layers:
            h, r = chunked(layer, chunk)(positions[None], h, BATCH, residual=r)
        got = h + r
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [7, 16])
def test_plain_layers_in_query_chunks_equal_the_whole_forward(chunk):
    torch.manual_seed(1)
    layers = [PlainLayer() for _ in range(2)]
    x = torch.randn(48, HIDDEN)
    positions = torch.arange(48)
    with torch.no_grad():
        want = x.clone()
        for layer in layers:
            want = layer(positions, want, BATCH)
        got = x.clone()
        for layer in layers:
            got = chunked(layer, chunk)(positions, got, BATCH)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_the_attention_runs_as_its_own_outside_the_chunked_forward():
    torch.manual_seed(2)
    layer = PlainLayer()
    x, positions = torch.randn(20, HIDDEN), torch.arange(20)
    with torch.no_grad():
        before = layer(positions, x, BATCH)
        chunked(layer, 8)(positions, x.clone(), BATCH)  # installs the redirect
        after = layer(positions, x, BATCH)  # the slot is inactive: SGLang's forward
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_conventions_and_refusals():
    assert layer_chunks.plan_layer(PairLayer()).convention == PAIR
    assert layer_chunks.plan_layer(PlainLayer()).convention == PLAIN
    assert layer_chunks.plan_layer(BoundaryLayer()).convention == STREAM

    class Recurrent(PlainLayer):  # a linear-attention layer's state along the sequence
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(HIDDEN, HIDDEN, 4, groups=HIDDEN)

    class TwoAttentions(PlainLayer):
        def __init__(self):
            super().__init__()
            self.cross = Attention()

    class Unannotated(PlainLayer):
        def forward(self, positions, hidden_states, forward_batch):
            return hidden_states

    class PairReturnsTensor(PairLayer):
        def forward(self, positions, hidden_states, forward_batch, residual) -> torch.Tensor:
            return hidden_states

    class BothConventions(PairLayer):
        attn_boundary = ffn_boundary = object()

    refusals = {
        Recurrent(): "Conv1d mixes tokens outside attention",
        TwoAttentions(): "2 attention modules",
        PlainLayer(is_cross_attention=True): "cross-attention",
        PlainLayer(attn_type="decoder_bidirectional"): "decoder_bidirectional attention",
        PlainLayer(logit_cap=30.0): "soft-capping",
        PlainLayer(v_head_dim=16): "different q / k and v head dims",
        Unannotated(): "no residual convention known",
        PairReturnsTensor(): "not declared to return a pair",
        BothConventions(): "both a residual argument and SGLang's layer boundaries",
    }
    for layer, why in refusals.items():
        plan = layer_chunks.plan_layer(layer)
        assert isinstance(plan, str) and why in plan, (type(layer).__name__, plan)


def test_a_call_is_cut_along_each_arguments_token_dimension():
    n = 20

    def forward(positions, hidden_states, forward_batch, rope=None, capture=None, **extra):
        pass

    signature = inspect.signature(forward)
    cos = torch.randn(1, n, HEAD_DIM)
    mrope = torch.arange(3 * n).view(3, n)
    bound = signature.bind(
        torch.arange(n), torch.randn(n, HIDDEN), BATCH, rope=(cos, cos), flag=True, mrope=mrope
    )
    slicer = CallSlicer(bound, n, ("hidden_states", "forward_batch"))
    assert slicer.refusal is None
    args, kwargs = slicer.call(4, 9, {"hidden_states": "rows"})
    assert args[0].tolist() == list(range(4, 9)) and args[1] == "rows" and args[2] is BATCH
    rope = args[3]  # bound by name, passed as the signature places it
    assert rope[0].shape == (1, 5, HEAD_DIM)
    torch.testing.assert_close(rope[1], cos[:, 4:9])
    assert kwargs["mrope"].tolist() == mrope[:, 4:9].tolist() and kwargs["flag"] is True

    # What the slices cannot share leaves the call to the layer's whole forward.
    capture = signature.bind(torch.arange(n), torch.randn(n, HIDDEN), BATCH, capture=print)
    assert "'capture'" in CallSlicer(capture, n, ("forward_batch",)).refusal
    flat = signature.bind(torch.arange(n), torch.randn(n, HIDDEN), BATCH, rope=torch.ones(7))
    assert "not per token" in CallSlicer(flat, n, ("forward_batch",)).refusal


def test_the_slot_refuses_an_attention_call_it_cannot_take():
    attn = RadixAttention()
    slot = QueryChunkSlot()
    handed = []
    slot.begin(8, lambda q, k, v, start, end, sinks=None: handed.append((k, v, start, end)))
    slot.slice(0, 4)
    q, k = torch.randn(4, HEADS * HEAD_DIM), torch.randn(4, KV_HEADS * HEAD_DIM)
    with pytest.raises(RuntimeError, match="k_rope"):
        slot(attn, q, k, k, True, (), {"k_rope": k})
    with pytest.raises(RuntimeError, match="KV saved elsewhere"):
        slot(attn, q, k, k, False, (), {})
    slot(attn, q, k, k, True, (), {})
    with pytest.raises(RuntimeError, match="second call"):
        slot(attn, q, k, k, True, (), {})
    # the slice's k / v go to the attention as (rows, kv_heads, head_dim); the slot holds
    # no K / V of the layer while it runs (the backend keeps what later slices read; until
    # 2026-11-28 the slot held the layer's whole K and V here)
    ((k_handed, v_handed, start, end),) = handed
    assert k_handed.shape == (4, KV_HEADS, HEAD_DIM) and (start, end) == (0, 4)
    assert not any(isinstance(x, torch.Tensor) for x in vars(slot).values())
    slot.finish()
    assert not slot.active


def test_a_layer_whose_kv_a_fused_kernel_writes_is_known_before_it_is_chunked():
    """SGLang's Qwen3-MoE and gpt-oss pass save_kv_cache=False where a fused rotary kernel
    wrote the KV (CUDA, a bf16 pool): their unchunked calls mark the slot, and the
    scheduler's layer wrapper then runs them whole instead of in query chunks (whose
    slices would leave the pool's write to a kernel that never sees them). A chunked call
    that meets it first refuses by name and marks the slot too."""
    attention = RadixAttention()
    slot = QueryChunkSlot()
    layer_chunks.redirect_attention(attention, slot)
    q = torch.randn(5, HEADS * HEAD_DIM)
    k, v = torch.randn(5, KV_HEADS * HEAD_DIM), torch.randn(5, KV_HEADS * HEAD_DIM)
    attention(q, k, v, BATCH)
    assert not slot.writes_own_kv
    attention(q, k, v, BATCH, save_kv_cache=False)
    assert slot.writes_own_kv
    fresh = QueryChunkSlot()
    fresh.begin(5, lambda *a, **kw: None)
    fresh.slice(0, 5)
    with pytest.raises(RuntimeError, match="KV saved elsewhere"):
        fresh(attention, q, k, v, False, (), {})
    assert fresh.writes_own_kv
