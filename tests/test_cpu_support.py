"""The CPU support that lets SGLang 0.5.23 run without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
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


def _packed(lengths, heads=2, head_dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randn(sum(lengths), heads, head_dim, generator=g), cu


def test_flash_attention_forward_on_cpu_matches_attention_per_sequence():
    """The torch kernel sglang_patches gives aten._flash_attention_forward on CPU (the
    Clef joint schema head calls it) against plain attention of each packed sequence."""
    import torch.nn.functional as F

    from prefillonly_sgl.sglang_runtime.cpu_support.sglang_patches import varlen_attention_forward

    query, cu_q = _packed([3, 1, 4], seed=1)
    key, cu_k = _packed([5, 2, 4], seed=2)
    value, _ = _packed([5, 2, 4], seed=3)
    out, lse, *_ = varlen_attention_forward(query, key, value, cu_q, cu_k, 4, 5, 0.0, False, False)
    for (q0, q1), (k0, k1) in zip(zip(cu_q[:-1], cu_q[1:]), zip(cu_k[:-1], cu_k[1:])):
        q, k, v = (t.transpose(0, 1) for t in (query[q0:q1], key[k0:k1], value[k0:k1]))
        expected = F.scaled_dot_product_attention(q, k, v).transpose(0, 1)
        torch.testing.assert_close(out[q0:q1], expected, rtol=1e-5, atol=1e-6)
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        torch.testing.assert_close(lse[:, q0:q1], torch.logsumexp(scores, -1))
    # What the kernel does not implement is refused, not approximated.
    try:
        varlen_attention_forward(query, key, value, cu_q, cu_k, 4, 5, 0.0, True, False)
    except NotImplementedError as e:
        assert "causal" in str(e)
    else:
        raise AssertionError("causal attention must be refused")


def test_joint_schema_head_attention_runs_on_cpu_as_multihead_attention():
    """SGLang's Clef head attends with aten._flash_attention_forward (CUDA only in
    PyTorch); with the CPU support its _attention equals nn.MultiheadAttention on each
    request, the module its checkpoint was trained with."""
    from sglang.srt.layers.joint_schema_head import _attention

    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
    queries, cu_q = _packed([2, 3], heads=1, head_dim=16, seed=4)
    memory, cu_k = _packed([6, 4], heads=1, head_dim=16, seed=5)
    queries, memory = queries.squeeze(1), memory.squeeze(1)
    with torch.no_grad():
        out = _attention(attention, queries, memory, (cu_q, 3), (cu_k, 6))
        for (q0, q1), (k0, k1) in zip(zip(cu_q[:-1], cu_q[1:]), zip(cu_k[:-1], cu_k[1:])):
            q, m = queries[q0:q1].unsqueeze(0), memory[k0:k1].unsqueeze(0)
            expected = attention(q, m, m, need_weights=False)[0].squeeze(0)
            torch.testing.assert_close(out[q0:q1], expected, rtol=1e-5, atol=1e-6)


def test_weak_ref_tensor_describes_the_memory_and_passes_cpu_tensors_through():
    """The engine kit's weak_ref_tensor (SGLang's breakable prefill graphs call it): a CPU
    tensor comes back as itself (a strong reference: correct); a CUDA one is rebuilt from
    its __cuda_array_interface__, whose description (byte strides of a transposed view,
    bfloat16 as a same-sized integer) is checked here on CPU. The rebuild itself needs
    CUDA: the card run of 2026-11-27 captured the graphs with it."""
    tensor = torch.zeros(3, 4, dtype=torch.bfloat16).t()
    assert sgl_kernel_shim.weak_ref_tensor(tensor) is tensor
    typestr, raw = sgl_kernel_shim._RAW_TYPES[tensor.element_size()]
    assert raw.itemsize == 2 and typestr == "<i2"
    described = sgl_kernel_shim._BorrowedCudaMemory(tensor, typestr).__cuda_array_interface__
    assert described["shape"] == (4, 3) and described["strides"] == (2, 8)
    assert described["data"] == (tensor.data_ptr(), False) and described["version"] == 2


def test_lora_host_tensors_unpinned_only_inside_the_hooked_call():
    """SGLang's LoRA pins host tensors (sglang #31894): under the hook its calls leave them
    unpinned; outside it (and on other threads) torch is torch: nothing patched."""
    import threading

    from prefillonly_sgl.sglang_runtime.cpu_support import lora_host_tensors

    original = torch.Tensor.pin_memory

    def pins():
        a = torch.tensor([0, 4], dtype=torch.int32, device="cpu", pin_memory=True)
        b = torch.zeros((3,), dtype=torch.int32, pin_memory=True)
        return a, b, a.cpu().pin_memory()

    def other_thread():
        seen.append(torch._C._is_torch_function_mode_enabled())

    seen = []

    def hooked():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        return pins()

    a, b, c = lora_host_tensors.with_host_tensors_unpinned(hooked)
    assert a.tolist() == [0, 4] and b.tolist() == [0, 0, 0] and c is a
    assert seen == [False]  # the mode is this thread's, for the call
    assert torch.Tensor.pin_memory is original
    assert not torch._C._is_torch_function_mode_enabled()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="pin"):
            pins()
    assert set(lora_host_tensors.HOOKS) == set(lora_host_tensors.PINNING_FUNCTIONS)
