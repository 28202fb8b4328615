"""Per-device SGLang arguments, without SGLang."""

from __future__ import annotations

import pytest

from prefillonly_sgl.device_defaults import (
    CPU_DEFAULT_MAX_TOTAL_TOKENS,
    detect_device,
    sglang_engine_args,
)


def test_cpu_defaults_bound_the_kv_pool():
    args = sglang_engine_args("/m", "cpu")
    assert args["attention_backend"] == "torch_native"
    assert args["max_total_tokens"] == CPU_DEFAULT_MAX_TOTAL_TOKENS


def test_gpu_defaults_use_flashinfer_and_sglang_pool_sizing():
    args = sglang_engine_args("/m", "cuda")
    assert args["attention_backend"] == "flashinfer"
    assert "max_total_tokens" not in args


def test_explicit_arguments_win_and_none_means_default():
    args = sglang_engine_args(
        "/m", "cpu", max_total_tokens=1024, dtype=None, mem_fraction_static=0.5
    )
    assert args["max_total_tokens"] == 1024
    assert "dtype" not in args
    assert args["mem_fraction_static"] == 0.5


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported device 'tpu'"):
        sglang_engine_args("/m", "tpu")


def test_detect_device(monkeypatch):
    monkeypatch.setenv("PREFILLONLY_DEVICE", "cuda")
    assert detect_device() == "cuda"
    monkeypatch.delenv("PREFILLONLY_DEVICE")
    import torch

    assert detect_device() == ("cuda" if torch.cuda.is_available() else "cpu")
