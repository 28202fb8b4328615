"""Per-device SGLang arguments, without SGLang."""

from __future__ import annotations

import pytest

from prefillonly_sgl.machine.device_defaults import (
    CPU_DEFAULT_MAX_TOTAL_TOKENS,
    detect_device,
    sglang_defaults,
)


def test_cpu_defaults_bound_the_kv_pool():
    args = sglang_defaults("cpu")
    assert args["attention_backend"] == "torch_native"
    assert args["max_total_tokens"] == CPU_DEFAULT_MAX_TOTAL_TOKENS
    assert args["sleep_on_idle"] is True


def test_gpu_defaults_use_flashinfer_and_sglang_pool_sizing():
    args = sglang_defaults("cuda")
    assert args["attention_backend"] == "flashinfer"
    assert "max_total_tokens" not in args


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported device 'tpu'"):
        sglang_defaults("tpu")


def test_detect_device(monkeypatch):
    monkeypatch.setenv("PREFILLONLY_DEVICE", "cuda")
    assert detect_device() == "cuda"
    monkeypatch.delenv("PREFILLONLY_DEVICE")
    import torch

    assert detect_device() == ("cuda" if torch.cuda.is_available() else "cpu")
