"""The CPU support that lets SGLang 0.5.23 run without a GPU."""

from __future__ import annotations

import subprocess
import sys

import torch

from prefillonly_sgl.sglang_runtime.cpu_support import sgl_kernel_shim


def test_assign_req_to_token_pool_matches_the_kernel_semantics():
    req_to_token = torch.zeros(4, 10, dtype=torch.int32)
    # request rows 2 and 0 get tokens [3, 6) and [0, 2) from out_cache_loc, in order
    sgl_kernel_shim.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        req_to_token,
        torch.tensor([3, 0]),
        torch.tensor([6, 2]),
        torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64),
        10,
    )
    assert req_to_token[2].tolist() == [0, 0, 0, 11, 12, 13, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [21, 22] + [0] * 8
    assert req_to_token[[1, 3]].abs().sum() == 0


def test_copy_all_layer_kv_cache_moves_slots_in_every_buffer():
    layers = [torch.arange(12, dtype=torch.float32).reshape(6, 2) + 100 * i for i in range(3)]
    ptrs = torch.tensor([t.data_ptr() for t in layers])
    strides = torch.tensor([t.stride(0) * t.element_size() for t in layers])
    sgl_kernel_shim.copy_all_layer_kv_cache_cpu(
        ptrs, strides, torch.tensor([0, 5]), torch.tensor([3, 1])
    )
    for i, t in enumerate(layers):
        assert t[0].tolist() == [6 + 100 * i, 7 + 100 * i]
        assert t[5].tolist() == [2 + 100 * i, 3 + 100 * i]
        assert t[2].tolist() == [4 + 100 * i, 5 + 100 * i]  # untouched


def test_other_kernels_fail_only_when_called():
    kernel = sgl_kernel_shim.silu_and_mul  # importable, as SGLang's module imports need
    try:
        kernel(torch.zeros(2))
    except NotImplementedError as e:
        assert "silu_and_mul" in str(e) and "without an sgl-kernel build" in str(e)
    else:
        raise AssertionError("the shim must not pretend to implement GPU kernels")


def test_fresh_interpreter_has_cpu_support_active():
    """What SGLang's spawned workers see: the .pth hook ran before any user code."""
    code = (
        "import os, sgl_kernel, torchvision;"
        "print(os.environ['SGLANG_USE_CPU_ENGINE'], sgl_kernel.__version__, torchvision.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    env_flag, shim_version, _ = out.stdout.split()
    assert env_flag == "1"
    assert "prefillonly-cpu-shim" in shim_version
