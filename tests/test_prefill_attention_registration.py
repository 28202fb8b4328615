"""The prefill_attention plugin feature puts our factories under SGLang's backend names
(and only when applied), keeping the stock factories for the cases it defers to."""

from __future__ import annotations

import importlib

from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.sglang_runtime import plugin


def test_feature_is_declared_and_resolves():
    module_name, function_name = FEATURES["prefill_attention"].register.split(":")
    assert callable(getattr(importlib.import_module(module_name), function_name))


def test_register_replaces_factories_by_name_and_keeps_stock_ones():
    from sglang.srt.layers.attention import attention_registry as registry

    from prefillonly_sgl.features.prefill_attention import scheduler_torch_backend as ours

    saved = dict(registry.ATTENTION_BACKENDS)
    try:
        ours.register()
        assert registry.ATTENTION_BACKENDS["torch_native"] is ours.create_torch_backend
        assert registry.ATTENTION_BACKENDS["flashinfer"] is ours.create_flashinfer_backend
        # The stock factory is kept for MLA / speculative decoding, even when register()
        # runs twice (an Engine in this process already applied the plugin).
        stock = ours._STOCK_FACTORIES["flashinfer"]
        assert stock.__module__ == registry.__name__ and stock is not ours.create_flashinfer_backend
        ours.register()
        assert ours._STOCK_FACTORIES["flashinfer"] is stock
        # triton: ours for a CPU runner only (window_models.py), SGLang's kept for GPUs
        assert registry.ATTENTION_BACKENDS["triton"] is ours.create_triton_backend
        assert ours._STOCK_FACTORIES["triton"].__module__ == registry.__name__
        assert registry.ATTENTION_BACKENDS["fa3"] is saved["fa3"]  # others untouched
    finally:
        registry.ATTENTION_BACKENDS.clear()
        registry.ATTENTION_BACKENDS.update(saved)


def test_runtime_enabled_sets_and_restores_the_environment(monkeypatch, tmp_path):
    from prefillonly_sgl.config import runtime_config
    from prefillonly_sgl.config.runtime_config import WorkerConfig
    from prefillonly_sgl.machine import environment

    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    config = runtime_config.resolve(
        tmp_path, device="cpu", features=["prefill_attention"], switches={}
    )
    monkeypatch.delenv(environment.RUNTIME_CONFIG, raising=False)
    with plugin.runtime_enabled(config):
        assert WorkerConfig.from_environment() == config.worker
        assert WorkerConfig.from_environment().features == ("prefill_attention",)
    assert environment.RUNTIME_CONFIG not in __import__("os").environ
