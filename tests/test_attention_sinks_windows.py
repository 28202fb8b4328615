"""Sliding windows and attention sinks (gpt-oss) in the CPU prefill-only attention kernels,
on random tensors (no SGLang): every path (a request alone, in query blocks, padded groups,
shared-prefix groups merged by log-sum-exp, query chunks of hybrid prefilling) equals a
naive softmax over each request's prefix + new tokens with the window's mask and the sink
logit in the denominator (float32, 1e-5); sinks and windows each change the rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_prefill_attention_kernel import GROUPS, SMALL_BLOCKS, D, make_batch, make_shared_batch
from test_query_chunk_attention import run_chunks

from prefillonly_sgl.features.prefill_attention import windowed
from prefillonly_sgl.features.prefill_attention.cpu_extend import ExtendAttention
from prefillonly_sgl.features.prefill_attention.plan import Limits
from prefillonly_sgl.features.prefill_attention.query_chunk import QueryChunkAttention
from prefillonly_sgl.features.prefill_attention.sink_models import (
    CPU_SINK_BACKEND,
    sink_model_fields,
)
from prefillonly_sgl.features.prefill_attention.window_models import (
    CPU_WINDOW_BACKEND,
    window_model_fields,
)

SCALE = D**-0.5


def naive(q_new, k_all, v_all, scale, window=None, sinks=None):
    """float64 softmax of the new rows over prefix + new keys: causal, keys at most
    `window` positions back, each head's sink logit an extra term of the denominator."""
    n_new, kv_len = q_new.shape[0], k_all.shape[0]
    group = q_new.shape[1] // k_all.shape[1]
    k = k_all.double().repeat_interleave(group, dim=1)
    v = v_all.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q_new.double(), k) * scale  # (H, n, kv)
    rel = torch.arange(kv_len - n_new, kv_len).unsqueeze(1) - torch.arange(kv_len)
    seen = (rel >= 0) & (rel <= window) if window is not None else rel >= 0
    scores = scores.masked_fill(~seen, float("-inf"))
    if sinks is not None:  # one more logit per head, with no value
        sink = sinks.double().view(-1, 1, 1).expand(-1, n_new, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def expected(spans, slots, q, k, v, k_pool, v_pool, window=None, sinks=None):
    rows = []
    for span, s in zip(spans, slots):
        new = slice(span.q_start, span.q_start + span.n_new)
        k_all, v_all = k[new], v[new]
        if span.prefix_len:
            k_all, v_all = torch.cat([k_pool[s], k_all]), torch.cat([v_pool[s], v_all])
        rows.append(naive(q[new], k_all, v_all, SCALE, window, sinks))
    return torch.cat(rows)


def sinks_for(heads: int) -> torch.Tensor:
    # large enough that a kernel ignoring them is far off (the sink takes ~half the mass)
    return torch.linspace(-1.0, 3.0, heads)


CASES = [
    ([0], [37]),  # cold, longer than the window
    ([50], [20]),  # a hit: the window reaches into the prefix
    ([50], [1]),  # one new token
    ([0, 30, 64, 5], [17, 9, 33, 1]),  # mixed batch
]
SETTINGS = [(8, None), (None, "sinks"), (8, "sinks"), (0, "sinks")]  # window 0: itself only


@pytest.mark.parametrize("prefix_lens, new_lens", CASES)
@pytest.mark.parametrize("window, sinks", SETTINGS, ids=str)
@pytest.mark.parametrize(
    "limits", [Limits(), SMALL_BLOCKS, GROUPS], ids=["plain", "blocks", "groups"]
)
def test_extend_matches_naive_softmax(prefix_lens, new_lens, window, sinks, limits):
    spans, slots, q, k, v, k_pool, v_pool = make_batch(prefix_lens, new_lens)
    sinks = sinks_for(q.shape[1]) if sinks else None
    attention = ExtendAttention(spans, slots, limits=dataclasses.replace(limits))
    got = attention(q, k, v, k_pool, v_pool, SCALE, window=window, sinks=sinks)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, window, sinks)
    assert (got.double() - want).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "new_lens, others",
    [([20, 20, 20], []), ([30, 7, 1, 25], [(0, 33), (25, 9)])],
)
@pytest.mark.parametrize("window, sinks", SETTINGS, ids=str)
def test_shared_prefix_group_matches_naive_softmax(new_lens, others, window, sinks):
    spans, slots, q, k, v, k_pool, v_pool = make_shared_batch(60, new_lens, others)
    sinks = sinks_for(q.shape[1]) if sinks else None
    attention = ExtendAttention(spans, slots)
    assert [sorted(g.group.members) for g in attention.shared] == [list(range(len(new_lens)))]
    out = torch.full_like(q, float("nan"))
    attention(q, k, v, k_pool, v_pool, SCALE, out, window=window, sinks=sinks)
    want = expected(spans, slots, q, k, v, k_pool, v_pool, window, sinks)
    assert (out.double() - want).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    "prefix_lens, new_lens, chunk",
    [
        ([0], [97], 16),
        ([40], [77], 20),
        ([0, 30, 0, 30], [50, 9, 33, 21], 24),
        ([12, 12, 0], [5, 70, 3], 64),
    ],
)
@pytest.mark.parametrize("window, sinks", SETTINGS, ids=str)
def test_query_chunks_match_naive_softmax(prefix_lens, new_lens, chunk, window, sinks):
    """Every row owning a pool slot (the rows' keys read back from the pool by the later
    chunks; kept keys of rows without one: tests/test_query_chunk_layer_keys.py)."""
    batch = make_batch(prefix_lens, new_lens)
    spans, slots, q, k, v, k_pool, v_pool = batch
    sinks = sinks_for(q.shape[1]) if sinks else None
    want = expected(spans, slots, q, k, v, k_pool, v_pool, window, sinks)
    got = run_chunks(
        batch, chunk, None, "consecutive", QueryChunkAttention, SCALE, window=window, sinks=sinks
    )
    assert (got.double() - want).abs().max() < 1e-5


def test_sinks_and_window_each_change_the_rows():
    """The references differ by far more than the tolerance: a kernel that ignored either
    would fail the tests above."""
    spans, slots, q, k, v, k_pool, v_pool = make_batch([30], [40])
    plain = expected(spans, slots, q, k, v, k_pool, v_pool)
    with_sinks = expected(spans, slots, q, k, v, k_pool, v_pool, sinks=sinks_for(q.shape[1]))
    with_window = expected(spans, slots, q, k, v, k_pool, v_pool, window=8)
    assert (plain - with_sinks).abs().max() > 0.1
    assert (plain - with_window).abs().max() > 0.1


def test_sinks_are_the_softmax_of_one_more_logit():
    """with_sinks(o, lse, sink) is o * e^lse / (e^lse + e^sink), from any part's lse."""
    o, lse = torch.ones(3, 2, 4), torch.tensor([[0.0, 1.0]] * 3)
    got = windowed.with_sinks(o, lse, torch.tensor([0.0, 1.0]))
    assert torch.allclose(got, torch.full_like(o, 0.5))
    assert windowed.with_sinks(o, lse, None) is o


def test_visible_is_torch_natives_sliding_window_mask():
    """SGLang's torch_native mask: k <= q and k >= q - window (windowed.visible)."""
    q_pos, k_pos = torch.arange(5, 9), torch.arange(9)
    seen = windowed.visible(q_pos, k_pos, 2)
    want = (k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)) & (
        k_pos.unsqueeze(0) >= q_pos.unsqueeze(1) - 2
    )
    assert torch.equal(seen, want)
    assert windowed.first_key(5, 2) == 3 and windowed.first_key(1, 2) == 0
    assert windowed.first_key(5, None) == 0


def test_a_sink_model_on_cpu_asks_for_sglangs_own_cpu_backend():
    """sink_models.py: torch_native (our device default) becomes intel_amx, SGLang's own
    choice for gpt-oss on a CPU (our backend under both names), with one KV pool; other
    models, other devices and backends the user chose are left to SGLang."""
    fields = sink_model_fields("cpu", "torch_native", None, None, has_sinks=True)
    assert fields["attention_backend"] == CPU_SINK_BACKEND == "intel_amx"
    assert fields["disable_hybrid_swa_memory"] is True
    assert sink_model_fields("cpu", "torch_native", "torch_native", None, True)
    assert sink_model_fields("cpu", "torch_native", None, None, has_sinks=False) == {}
    assert sink_model_fields("cuda", "flashinfer", None, None, has_sinks=True) == {}
    assert sink_model_fields("cpu", "intel_amx", None, None, has_sinks=True) == {
        "disable_hybrid_swa_memory": True  # intel_amx by name: ours too, one pool
    }
    assert sink_model_fields("cpu", "torch_native", "triton", None, has_sinks=True) == {}


def test_a_sink_model_on_cuda_runs_ours_only_with_the_opt_in(monkeypatch):
    """On CUDA SGLang holds gpt-oss to triton / trtllm_mha / fa3 / fa4: with the opt-in
    (PREFILLONLY_CUDA_SINKS=1) our device default, flashinfer, becomes triton, under which
    a CUDA runner of a sink model gets our FlashInfer backend; without it, or with a
    backend the user chose, SGLang decides (stock, without our features)."""
    from types import SimpleNamespace

    from prefillonly_sgl.features.prefill_attention import scheduler_torch_backend as backends
    from prefillonly_sgl.features.prefill_attention.sink_models import CUDA_SINK_BACKEND
    from prefillonly_sgl.hooking import process_state

    fields = sink_model_fields("cuda", "flashinfer", None, None, True, cuda_opt_in=True)
    assert fields["attention_backend"] == CUDA_SINK_BACKEND == "triton"
    assert fields["disable_hybrid_swa_memory"] is True
    assert sink_model_fields("cuda", "flashinfer", None, None, True) == {}  # no opt-in
    assert sink_model_fields("cuda", "fa3", None, None, True, cuda_opt_in=True) == {}
    assert sink_model_fields("cuda", "flashinfer", None, None, False, cuda_opt_in=True) == {}
    assert sink_model_fields("cuda", "triton", None, None, True, cuda_opt_in=True) == {
        "disable_hybrid_swa_memory": True
    }
    made = []
    monkeypatch.setattr(backends, "create_flashinfer_backend", lambda r: made.append(r) or "ours")
    monkeypatch.setitem(backends._STOCK_FACTORIES, "triton", lambda r: "stock triton")
    state = process_state.current()
    sink_runner = SimpleNamespace(
        device="cuda", model_config=SimpleNamespace(has_attention_sinks=True)
    )
    plain = SimpleNamespace(device="cuda", model_config=SimpleNamespace(has_attention_sinks=False))
    monkeypatch.setattr(state, "switches", dataclasses.replace(state.switches, cuda_sinks=False))
    assert backends.create_triton_backend(sink_runner) == "stock triton"
    monkeypatch.setattr(state, "switches", dataclasses.replace(state.switches, cuda_sinks=True))
    assert backends.create_triton_backend(sink_runner) == "ours" and made == [sink_runner]
    assert backends.create_triton_backend(plain) == "stock triton"


def test_flashinfers_log_sum_exp_takes_the_sinks_exactly():
    """flashinfer_chunk.with_sinks, used by the FlashInfer backend's prefill and decode
    with sinks: FlashInfer's output and base-2 log-sum-exp with the sink logits in the
    denominator equal a naive softmax over the keys and the sink."""
    from prefillonly_sgl.features.prefill_attention.flashinfer_chunk import with_sinks

    torch.manual_seed(5)
    n, heads, keys, d = 3, 4, 7, 8
    logits = torch.randn(heads, n, keys, dtype=torch.float64)
    v = torch.randn(keys, heads, d, dtype=torch.float64)
    sinks = torch.randn(heads, dtype=torch.float64)
    o = torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)
    lse2 = (torch.logsumexp(logits, -1) / torch.log(torch.tensor(2.0))).transpose(0, 1)
    with_sink = torch.cat([logits, sinks[:, None, None].expand(heads, n, 1)], -1).softmax(-1)
    want = torch.einsum("hqk,khd->qhd", with_sink[..., :keys], v)
    assert torch.allclose(with_sinks(o, lse2, sinks), want.to(o.dtype), atol=1e-6)


def test_a_window_model_held_to_a_gpu_backend_asks_for_ours_by_sglangs_cpu_choice():
    """window_models.py: EXAONE 4 with windows on a CPU gets triton (SGLang's own choice
    there, our backend under that name), with one KV pool; without windows, on another
    device, for another architecture or backends the user chose: left to SGLang."""
    exaone = "Exaone4ForCausalLM"
    fields = window_model_fields("cpu", "torch_native", None, None, exaone, True)
    assert fields["attention_backend"] == CPU_WINDOW_BACKEND == "triton"
    assert fields["disable_hybrid_swa_memory"] is True
    assert window_model_fields("cpu", "triton", None, None, exaone, True) == {
        "disable_hybrid_swa_memory": True
    }
    assert window_model_fields("cpu", "torch_native", None, None, exaone, False) == {}
    assert window_model_fields("cuda", "flashinfer", None, None, exaone, True) == {}
    assert window_model_fields("cpu", "torch_native", None, None, "Gemma3ForCausalLM", True) == {}
    assert window_model_fields("cpu", "torch_native", "fa3", None, exaone, True) == {}
