"""Where prefill-only KV turns itself on, without starting SGLang.

A scheduler drops scoring requests' suffix KV only if its prefill attention never reads
new tokens back from the pool. FlashInfer (GPU) cannot run here, so its decision is tested
on its inputs, and the SGLang source it mirrors is pinned: a change there fails this file.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
    flashinfer_pool_reads,
)
from prefillonly_sgl.features.prefill_attention.scheduler_torch_backend import (
    PrefillOnlyTorchBackend,
)
from prefillonly_sgl.features.prefill_kv import scheduler_process

RAGGED_ALWAYS = dict(
    is_multimodal=False,
    enable_mis=False,
    enable_deterministic=False,
    use_paged=False,
    num_wrappers=1,
    use_sliding_window_kv_pool=False,
    prefill_uses_dequant_workspace=False,
    is_dllm_model=False,
)


def test_flashinfer_supported_when_every_extend_runs_ragged():
    backend = SimpleNamespace(**RAGGED_ALWAYS)
    assert flashinfer_pool_reads(backend, None) is None
    assert flashinfer_pool_reads(backend, "breakable") is None  # attention runs eagerly


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(is_multimodal=True), "multimodal"),
        (dict(enable_mis=True), "multi-item scoring"),
        (dict(enable_deterministic=True), "deterministic"),
        (dict(use_paged=True), "SGLANG_FLASHINFER_USE_PAGED"),
        (dict(num_wrappers=2), "two wrappers"),
        (dict(use_sliding_window_kv_pool=True), "sliding-window KV pool"),
        (dict(prefill_uses_dequant_workspace=True), "FP4"),
        (dict(is_dllm_model=True), "dLLM"),
    ],
)
def test_flashinfer_paged_only_configurations_are_refused(change, reason):
    backend = SimpleNamespace(**(RAGGED_ALWAYS | change))
    assert reason in flashinfer_pool_reads(backend, None)


@pytest.mark.parametrize("graph", ["full", "tc_piecewise"])
def test_prefill_cuda_graphs_that_plan_paged_only_are_refused(graph):
    assert graph in flashinfer_pool_reads(SimpleNamespace(**RAGGED_ALWAYS), graph)


def test_the_mirrored_flashinfer_source_is_unchanged():
    """flashinfer_pool_reads restates when SGLang 0.5.23 plans the paged-only prefill."""
    init = inspect.getsource(FlashInferAttnBackend.__init__)
    for name in RAGGED_ALWAYS:
        assert f"self.{name} =" in init or f"self.{name}:" in init, name
    plan = inspect.getsource(FlashInferAttnBackend.init_forward_metadata)
    assert "if self.is_multimodal or self.enable_mis:" in plan
    assert "not self.enable_deterministic" in plan and "not self.use_paged" in plan
    assert "not is_in_tc_piecewise_cuda_graph()" in plan
    forward = inspect.getsource(FlashInferAttnBackend.forward_extend)
    assert "if not self.forward_metadata.use_ragged:" in forward
    assert "prefill_wrapper_ragged.forward_return_lse(" in forward


def _torch_backend(**runner):
    backend = PrefillOnlyTorchBackend.__new__(PrefillOnlyTorchBackend)
    backend.use_sliding_window_kv_pool = runner.get("swa_pool", False)
    backend._model_runner = SimpleNamespace(
        sliding_window_size=runner.get("window"),
        model_config=SimpleNamespace(is_encoder_decoder=runner.get("enc_dec", False)),
    )
    return backend


def test_torch_backend_refuses_models_with_layers_it_leaves_to_stock():
    assert _torch_backend().prefill_only_kv_unsupported() is None
    # Sliding-window layers run in the prefill-only kernels (windowed.py); SGLang's hybrid
    # sliding-window pool (a second pool for those layers) is left to the stock path.
    assert _torch_backend(window=4096).prefill_only_kv_unsupported() is None
    swa_pool = _torch_backend(window=4096, swa_pool=True).prefill_only_kv_unsupported()
    assert "sliding-window KV pool" in swa_pool
    assert "cross-attention" in _torch_backend(enc_dec=True).prefill_only_kv_unsupported()


def _worker(backend, allocator=None, dllm=False):
    if allocator is None:
        allocator = TokenToKVPoolAllocator.__new__(TokenToKVPoolAllocator)
        allocator.page_size = 1
    runner = SimpleNamespace(token_to_kv_pool_allocator=allocator, attn_backend=backend)
    return SimpleNamespace(is_dllm=lambda: dllm), runner


def test_scheduler_decision():
    ours = _torch_backend()
    assert scheduler_process._unsupported_here(*_worker(ours)) is None
    # A hybrid (prefill / decode) backend: the prefill side is asked.
    hybrid = HybridAttnBackend.__new__(HybridAttnBackend)
    hybrid.prefill_backend, hybrid.decode_backend = ours, object()
    assert scheduler_process._unsupported_here(*_worker(hybrid)) is None
    hybrid.prefill_backend = SimpleNamespace()
    assert "not prefillonly's" in scheduler_process._unsupported_here(*_worker(hybrid))
    # FlashInfer's backend names its kernel in `prefill_backend` ("fa2"): not a wrapper.
    flashinfer_like = SimpleNamespace(prefill_backend="fa2", prefill_only_kv_unsupported=None)
    flashinfer_like.prefill_only_kv_unsupported = lambda: None
    assert scheduler_process._unsupported_here(*_worker(flashinfer_like)) is None
    assert "dLLM" in scheduler_process._unsupported_here(*_worker(ours, dllm=True))
    stock = SimpleNamespace()  # stock backends have no prefill_only_kv_unsupported
    assert "not prefillonly's" in scheduler_process._unsupported_here(*_worker(stock))
    paged = TokenToKVPoolAllocator.__new__(TokenToKVPoolAllocator)
    paged.page_size = 16
    assert "page size 16" in scheduler_process._unsupported_here(*_worker(ours, allocator=paged))
    other = SimpleNamespace(page_size=1)
    assert "allocator" in scheduler_process._unsupported_here(*_worker(ours, allocator=other))


def test_only_rows_with_a_pool_slot_are_written(monkeypatch):
    from prefillonly_sgl.features.prefill_attention.scheduler_torch_backend import _kept_rows

    loc = torch.tensor([7, 8, 0, 0, 9, 0])  # DROPPED_SLOT (0): KV dropped by prefill-only KV
    monkeypatch.setattr(scheduler_process.STATE, "active", True)
    assert _kept_rows(loc).tolist() == [0, 1, 4]
    assert _kept_rows(torch.tensor([7, 8])) is None  # nothing dropped: write as stock
    monkeypatch.setattr(scheduler_process.STATE, "active", False)
    assert _kept_rows(loc) is None


def test_stock_fallback_refuses_tokens_without_pool_kv(monkeypatch):
    from prefillonly_sgl.features.prefill_attention.scheduler_torch_backend import (
        _refuse_dropped_tokens,
    )

    batch = SimpleNamespace(out_cache_loc=torch.tensor([7, 0]))
    monkeypatch.setattr(scheduler_process.STATE, "active", True)
    with pytest.raises(RuntimeError, match="--disable-prefill-only-kv"):
        _refuse_dropped_tokens(batch)
    _refuse_dropped_tokens(SimpleNamespace(out_cache_loc=torch.tensor([7, 8])))  # all real
    monkeypatch.setattr(scheduler_process.STATE, "active", False)
    _refuse_dropped_tokens(batch)


def test_flashinfer_refuses_a_paged_only_plan_under_prefill_only_kv(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend import (
        PrefillOnlyFlashInferBackend,
    )

    def stock_plan(self, forward_batch):  # stands in for FlashInfer's planning (no GPU)
        self.forward_metadata = SimpleNamespace(use_ragged=forward_batch.ragged)

    monkeypatch.setattr(FlashInferAttnBackend, "init_forward_metadata", stock_plan)
    backend = PrefillOnlyFlashInferBackend.__new__(PrefillOnlyFlashInferBackend)
    paged = SimpleNamespace(forward_mode=ForwardMode.EXTEND, ragged=False)
    monkeypatch.setattr(scheduler_process.STATE, "active", True)
    with pytest.raises(RuntimeError, match="paged-only prefill"):
        backend.init_forward_metadata(paged)
    backend.init_forward_metadata(SimpleNamespace(forward_mode=ForwardMode.EXTEND, ragged=True))
    backend.init_forward_metadata(SimpleNamespace(forward_mode=ForwardMode.DECODE, ragged=False))
    monkeypatch.setattr(scheduler_process.STATE, "active", False)
    backend.init_forward_metadata(paged)


def test_the_setwise_readout_keeps_the_cache_for_causal_lms_only(monkeypatch):
    """prefill_kv/tokenizer_process.py: where prefill-only KV runs, a causal LM's setwise
    request is checked without SGLang's conditions on the radix cache and chunked prefill
    (ours meets both otherwise) but with its other two (item_first, auto-truncation) and
    their messages; a classification head's setwise request (an embedding request whose
    pooling positions nothing moves) and every engine without prefill-only KV get SGLang's
    whole check. No SGLang global is changed on the way."""
    from types import SimpleNamespace as NS

    from sglang.srt.managers import tokenizer_manager_score_mixin as mixin

    from prefillonly_sgl.features.prefill_kv import setwise
    from prefillonly_sgl.features.prefill_kv.tokenizer_process import (
        _around_validate_score_extraction as around,
    )
    from prefillonly_sgl.features.prefill_kv.tokenizer_process import allow_setwise_with_cache

    real = mixin.get_memory, mixin.get_schedule
    seen = []

    def sglangs_check(self, is_generation, item_first):
        seen.append("SGLang's check")

    serving = NS(allow_auto_truncate=False)
    monkeypatch.setattr("sglang.srt.runtime_context.get_serving", lambda: serving)
    ours, stock = NS(), NS()
    allow_setwise_with_cache(ours, True)
    allow_setwise_with_cache(stock, False)
    around(sglangs_check, ours, True, False)  # passes without SGLang's cache conditions
    around(sglangs_check, ours, False, False)  # a head: SGLang's
    around(sglangs_check, stock, True, False)  # no prefill-only KV: SGLang's
    assert seen == ["SGLang's check", "SGLang's check"]
    with pytest.raises(ValueError, match="item_first is not supported"):
        around(sglangs_check, ours, True, True)
    with pytest.raises(ValueError, match="item_first is not supported"):
        around(sglangs_check, ours, True, item_first=True)
    serving.allow_auto_truncate = True
    with pytest.raises(ValueError, match="--allow-auto-truncate"):
        around(sglangs_check, ours, True, False)
    assert setwise.setwise_refusal(False, False) is None
    assert (mixin.get_memory, mixin.get_schedule) == real  # SGLang's globals untouched


def test_the_setwise_messages_are_sglangs_own(monkeypatch):
    """features/prefill_kv/setwise.py's two messages, word for word SGLang's: its real check
    run with its cache and chunk conditions met (a test may patch SGLang's module; the
    engine never does)."""
    from types import SimpleNamespace as NS

    from sglang.srt.managers import tokenizer_manager_score_mixin as mixin

    from prefillonly_sgl.features.prefill_kv import setwise

    monkeypatch.setattr(mixin, "get_memory", lambda: NS(disable_radix_cache=True))
    monkeypatch.setattr(mixin, "get_schedule", lambda: NS(chunked_prefill_size=-1))
    serving = NS(allow_auto_truncate=False)
    monkeypatch.setattr(mixin, "get_serving", lambda: serving)
    check = mixin.TokenizerManagerScoreMixin._validate_score_extraction
    with pytest.raises(ValueError) as refused:
        check(NS(), True, True)
    assert str(refused.value) == setwise.ITEM_FIRST
    serving.allow_auto_truncate = True
    with pytest.raises(ValueError) as refused:
        check(NS(), True, False)
    assert str(refused.value) == setwise.AUTO_TRUNCATE
