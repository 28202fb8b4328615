"""The kernel profile (issue 83, item 2): PREFILLONLY_KERNEL_PROFILE=<file>, armed by
`<file>.arm` holding a count, profiles that many extend forwards with torch.profiler and
appends one stage table per forward (stages.py classifies kernel and op names: realistic
CUDA names here, a CPU run below); unarmed, it costs one os.path.exists per extend
forward, and unset nothing at all.

CUDA cannot run here: its kernels' classification is checked on their names, and the
reading of CUDA events on stand-ins; the profiled step itself runs on the CPU (a model of
stand-in SGLang modules, then a real tiny engine).
"""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import FORWARD_LOG, KERNEL_PROFILE, ProcessSwitches
from prefillonly_sgl.sglang_runtime.forward_profile import kernel_profile as kp
from prefillonly_sgl.sglang_runtime.forward_profile import scheduler_process as sp
from prefillonly_sgl.sglang_runtime.forward_profile.stages import (
    STAGES,
    Row,
    busy_us,
    module_kind,
    stage_of,
    summarize,
)

# Kernel names as the CUDA profiler reports them (shortened where only template
# arguments were cut).
CUDA_NAMES = {
    "void flashinfer::BatchPrefillWithRaggedKVCacheKernel<flashinfer::KernelTraits<"
    "(flashinfer::MaskMode)1, 128u, 2u, 4u>, flashinfer::DefaultAttention<false, false, "
    "false, false>, flashinfer::RaggedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
    "int> >(flashinfer::RaggedParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>)": (
        "attention"
    ),
    "void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<"
    "(flashinfer::MaskMode)0, 16u, 8u, 8u>, flashinfer::DefaultAttention<false>>": "attention",
    "void flashinfer::PrefillWithKVCacheKernel<flashinfer::CollectiveMainloop<cutlass::"
    "bfloat16_t, 128>, flashinfer::CollectiveEpilogue<cutlass::bfloat16_t> >": "attention",
    "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>, true>": "attention",
    "void flashinfer::MergeStateKernel<true, 8u, 16u, 8u, 4u, __nv_bfloat16, __nv_bfloat16>"
    "(__nv_bfloat16*, float*, __nv_bfloat16*, float*, __nv_bfloat16*, float*, unsigned int,"
    " unsigned int)": "merge",
    "void flashinfer::MergeStatesKernel<8u, 16u, 8u, 4u, __nv_bfloat16>": "merge",
    "void flashinfer::MergeStateInPlaceKernel<8u, 16u, 8u, __nv_bfloat16>": "merge",
    "void (anonymous namespace)::store_kvcache_kernel<256, 2, true>"
    "(StoreKVCacheParams)": "kv_write",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
    "at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, "
    "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char*, long)#1}>"
    "(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, "
    "at::native::index_put_kernel_impl<at::native::OpaqueType<2> >(at::TensorIterator&, "
    "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char*, long)#1} const&, "
    "bool)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<...>::{lambda(int)#1})": (
        "kv_write"
    ),
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
    "at::native::index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIteratorBase&, "
    "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char*, long)#1}>": "other",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas": "gemm",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn": "gemm",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_"
    "align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::"
    "Params)": "gemm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel("
    "at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#4}::operator()()"
    " const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, "
    "at::native::silu_kernel(at::TensorIteratorBase&)::{lambda()#1}, "
    "at::detail::Array<char*, 2>)": "norm_rotary_act",
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, "
    "float, float, at::native::binary_internal::MulFunctor<float> >, "
    "at::detail::Array<char*, 3> >": "norm_rotary_act",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::MeanOps<float, float, float, float>, unsigned int, float, 4, 4> >"
    "(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
    "unsigned int, float, 4, 4>)": "norm_rotary_act",
    "void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>": "norm_rotary_act",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()"
    "() const::{lambda(float)#1}, at::detail::Array<char*, 2>, "
    "TrivialOffsetCalculator<1, unsigned int> >": "other",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
    "namespace)::OpaqueType<2u>, unsigned int, 2, 128, 1>": "other",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, "
    "unsigned int, 2, 2, -2, true>": "other",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, "
    "int)": "logits",
    "Memcpy HtoD (Pinned -> Device)": "other",
    "Memset (Device)": "other",
}

CPU_NAMES = {
    "aten::addmm": "gemm",
    "aten::mm": "gemm",
    "aten::bmm": "gemm",
    "aten::linear": "gemm",
    "aten::matmul": "gemm",
    "aten::scaled_dot_product_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::index_put_": "kv_write",
    "aten::silu": "norm_rotary_act",
    "aten::mul": "norm_rotary_act",
    "aten::rsqrt": "norm_rotary_act",
    "aten::add": "norm_rotary_act",
    "aten::log_softmax": "logits",
    "aten::embedding": "other",
    "aten::copy_": "other",
    "aten::index_select": "other",
    "aten::empty": "other",
}


@pytest.mark.parametrize("name", sorted(CUDA_NAMES))
def test_cuda_kernel_names_by_stage(name):
    assert stage_of(name) == CUDA_NAMES[name]


@pytest.mark.parametrize("name", sorted(CPU_NAMES))
def test_cpu_op_names_by_stage(name):
    assert stage_of(name) == CPU_NAMES[name]


def test_ranges_decide_what_names_cannot():
    """The LM head's GEMM is logits inside LogitsProcessor; whatever set_kv_buffer
    launches is kv_write; a named attention / merge / KV kernel keeps its name's stage;
    otherwise the innermost module decides (a cast in a linear layer is gemm, an add in a
    norm is norm_rotary_act, a bmm in our CPU attention is attention)."""
    gemm = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
    copy = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>"
    assert stage_of(gemm, ("logits",)) == "logits"
    assert stage_of(copy, ("attention", "kv_write")) == "kv_write"
    assert stage_of("void flashinfer::MergeStateKernel<true>", ("attention",)) == "merge"
    assert stage_of("aten::index_put_", ("attention",)) == "kv_write"
    assert stage_of(copy, ("linear",)) == "gemm"
    assert stage_of("void at::native::vectorized_elementwise_kernel<add>", ("norm",)) == (
        "norm_rotary_act"
    )
    assert stage_of("aten::bmm", ("attention",)) == "attention"
    assert stage_of("aten::softmax", ("attention",)) == "attention"
    assert stage_of("aten::index_select", ("embedding",)) == "other"


def test_module_kinds_by_class_name():
    kinds = {
        "QKVParallelLinear": "linear",
        "RowParallelLinear": "linear",
        "Linear": "linear",
        "RadixAttention": "attention",
        "RMSNorm": "norm",
        "GemmaRMSNorm": "norm",
        "LayerNorm": "norm",
        "Llama3RotaryEmbedding": "rotary",
        "YaRNScalingRotaryEmbedding": "rotary",
        "SiluAndMul": "activation",
        "GeluAndMul": "activation",
        "LogitsProcessor": "logits",
        "VocabParallelEmbedding": "embedding",
        "LlamaDecoderLayer": None,
        "LlamaMLP": None,
    }
    assert {name: module_kind(name) for name in kinds} == kinds


def test_summary_of_one_forward():
    rows = [
        Row("nvjet_gemm_a", 0, 100),
        Row("nvjet_gemm_a", 150, 250),
        Row("void flashinfer::BatchPrefillWithPagedKVCacheKernel<x>", 250, 400),
        Row("void flashinfer::MergeStateKernel<x>", 380, 420),  # overlaps, another stream
        Row("nvjet_gemm_b", 500, 600, ("logits",)),
    ]
    assert busy_us(rows) == 100 + 270 + 100
    summary = summarize(rows, wall_ms=1.0, top=2)
    assert summary["device_ms"] == pytest.approx(0.49)
    assert summary["busy_ms"] == pytest.approx(0.47)
    assert summary["host_ms"] == pytest.approx(0.53)  # the device ran nothing then
    assert list(summary["stages_ms"]) == list(STAGES)
    assert summary["stages_ms"]["gemm"] == pytest.approx(0.2)
    assert summary["stages_ms"]["attention"] == pytest.approx(0.15)
    assert summary["stages_ms"]["merge"] == pytest.approx(0.04)
    assert summary["stages_ms"]["logits"] == pytest.approx(0.1)
    assert sum(summary["stages_ms"].values()) == pytest.approx(summary["device_ms"])
    assert summary["kernels"][0] == ["nvjet_gemm_a", 0.2, 2] and len(summary["kernels"]) == 2
    long = summarize([Row("k" * 5000, 0, 1)], wall_ms=0.01)["kernels"][0][0]
    assert len(long) == 200


def test_cuda_rows_follow_each_kernel_to_the_op_that_launched_it():
    """On CUDA a kernel's ranges are those of the op whose correlation id it links to;
    a range's own span on the device and the CUDA runtime's calls are not kernels."""

    def event(name, device, start, end, **kw):
        fields = dict(
            name=name,
            device_type=device,
            time_range=SimpleNamespace(start=start, end=end),
            is_async=False,
            is_user_annotation=False,
            activity_type="cpu_op" if device == DeviceType.CPU else "kernel",
            linked_correlation_id=0,
            cpu_parent=None,
            id=0,
        )
        fields.update(kw)
        return SimpleNamespace(**fields)

    logits = event("prefillonly::logits", DeviceType.CPU, 0, 50, id=1, is_user_annotation=True)
    logits.activity_type = "user_annotation"
    mm = event("aten::mm", DeviceType.CPU, 5, 10, id=2, cpu_parent=logits)
    add = event("aten::add", DeviceType.CPU, 20, 25, id=3)
    launch = event("cudaLaunchKernel", DeviceType.CPU, 6, 7, id=9, linked_correlation_id=2)
    launch.activity_type = "cuda_runtime"
    events = [
        logits,
        mm,
        add,
        launch,
        event("nvjet_gemm", DeviceType.CUDA, 100, 160, id=9, linked_correlation_id=2),
        event("vectorized_elementwise_kernel<add>", DeviceType.CUDA, 160, 170, id=10,
              linked_correlation_id=3),
        event("prefillonly::logits", DeviceType.CUDA, 100, 160, id=11,
              linked_correlation_id=1, activity_type="gpu_user_annotation"),
    ]  # fmt: skip
    rows = kp.rows_of(events, cuda=True)
    assert rows == [
        Row("nvjet_gemm", 100, 160, ("logits",)),
        Row("vectorized_elementwise_kernel<add>", 160, 170, ()),
    ]
    assert [stage_of(r.name, r.kinds) for r in rows] == ["logits", "norm_rotary_act"]


# -- the profiled step on the CPU, with stand-in SGLang modules -----------------------
class QKVParallelLinear(torch.nn.Linear):
    pass


class RMSNorm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Pool:
    def __init__(self) -> None:
        self.k = torch.zeros(64, 16)

    def set_kv_buffer(self, loc, k):
        self.k[loc] = k


class RadixAttention(torch.nn.Module):
    def __init__(self, pool) -> None:
        super().__init__()
        self.pool = pool

    def forward(self, q):
        self.pool.set_kv_buffer(torch.arange(q.shape[0]), q)
        x = q[None, None]
        return F.scaled_dot_product_attention(x, x, x, is_causal=True)[0, 0]


class LogitsProcessor(torch.nn.Module):
    def forward(self, h, weight):
        return torch.log_softmax(h @ weight.T, dim=-1)


class TinyModel(torch.nn.Module):
    def __init__(self, pool) -> None:
        super().__init__()
        self.norm = RMSNorm()
        self.qkv = QKVParallelLinear(16, 16)
        self.attn = RadixAttention(pool)
        self.logits_processor = LogitsProcessor()
        self.lm_head = torch.nn.Parameter(torch.randn(100, 16))

    def forward(self, x):
        h = self.attn(self.qkv(self.norm(x)))
        return self.logits_processor(h + x, self.lm_head)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A stand-in scheduler on the CPU whose run_batch runs TinyModel, the kernel profile
    switched on (not armed) and the forward log off."""
    profile = tmp_path / "kernels.jsonl"
    state = process_state.current()
    monkeypatch.setattr(
        state,
        "switches",
        dataclasses.replace(
            state.switches, kernel_profile=str(profile), forward_log=None, forward_profile=None
        ),
    )
    monkeypatch.setattr(kp, "_state", {"left": 0})
    pool = Pool()
    model = TinyModel(pool)
    scheduler = SimpleNamespace(
        device="cpu",
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model, token_to_kv_pool=pool)),
    )
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_extend=lambda: True),
        reqs=[object(), object()],
        prefix_lens=[0, 4],
        extend_lens=[8, 4],
    )
    x = torch.randn(12, 16)

    def run_batch(self, batch):
        with torch.no_grad():
            return self.tp_worker.model_runner.model(x)

    return SimpleNamespace(
        profile=profile, arm=str(profile) + ".arm", scheduler=scheduler, batch=batch,
        run_batch=run_batch, model=model, pool=pool,
    )  # fmt: skip


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_armed_forwards_are_profiled_then_the_arm_file_goes(tiny):
    with open(tiny.arm, "w") as f:
        f.write("2\n")
    for _ in range(3):
        out = sp._around_run_batch(tiny.run_batch, tiny.scheduler, tiny.batch)
        assert out.shape == (12, 100)
    lines = _lines(tiny.profile)
    assert len(lines) == 2 and not os.path.exists(tiny.arm)  # the third ran unprofiled
    line = lines[0]
    assert set(line) == {
        "tokens", "requests", "device", "wall_ms", "launch_ms", "device_ms", "busy_ms",
        "host_ms", "module_ranges", "stages_ms", "kernels",
    }  # fmt: skip
    assert (line["tokens"], line["requests"], line["device"]) == (12, 2, "cpu")
    assert line["module_ranges"] is True
    stages = line["stages_ms"]
    assert list(stages) == list(STAGES)
    for stage in ("attention", "kv_write", "gemm", "norm_rotary_act", "logits"):
        assert stages[stage] > 0, stage
    assert sum(stages.values()) == pytest.approx(line["device_ms"], abs=1e-3)
    assert 0 < line["busy_ms"] <= line["wall_ms"]
    assert line["host_ms"] == pytest.approx(line["wall_ms"] - line["busy_ms"], abs=1e-3)
    assert line["launch_ms"] <= line["wall_ms"]
    names = [name for name, _, _ in line["kernels"]]
    assert "aten::linear" in names and len(names) <= 15
    assert all(isinstance(ms, float) and n >= 1 for _, ms, n in line["kernels"])
    # the ranges were taken off again: the model and the pool are as they were
    assert not tiny.model.norm._forward_pre_hooks and not tiny.model.norm._forward_hooks
    assert "set_kv_buffer" not in vars(tiny.pool)


@pytest.mark.parametrize(("text", "profiled"), [("", 1), ("junk", 1), ("0", 0), ("-3", 0)])
def test_the_arm_files_count(tiny, text, profiled):
    with open(tiny.arm, "w") as f:
        f.write(text)
    for _ in range(2):
        sp._around_run_batch(tiny.run_batch, tiny.scheduler, tiny.batch)
    assert len(_lines(tiny.profile)) == profiled and not os.path.exists(tiny.arm)


def test_unarmed_it_only_looks_for_the_arm_file_and_unset_not_even_that(tiny, monkeypatch):
    looked = []
    real_exists = os.path.exists

    def exists(path):
        looked.append(path)
        return real_exists(path)

    def never(*args, **kwargs):
        raise AssertionError("profiled without being armed")

    monkeypatch.setattr(kp.os.path, "exists", exists)
    monkeypatch.setattr(kp, "profile_step", never)
    sp._around_run_batch(tiny.run_batch, tiny.scheduler, tiny.batch)
    assert looked == [tiny.arm] and not tiny.profile.exists()
    state = process_state.current()
    monkeypatch.setattr(state, "switches", dataclasses.replace(state.switches, kernel_profile=None))
    sp._around_run_batch(tiny.run_batch, tiny.scheduler, tiny.batch)
    assert looked == [tiny.arm]


def test_a_profiler_that_fails_leaves_the_step_and_says_why(tiny, monkeypatch):
    import torch.profiler

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(torch.profiler, "profile", broken)
    with open(tiny.arm, "w") as f:
        f.write("1")
    out = sp._around_run_batch(tiny.run_batch, tiny.scheduler, tiny.batch)
    assert out.shape == (12, 100)
    (line,) = _lines(tiny.profile)
    assert line["error"] == "RuntimeError: CUPTI unavailable" and line["tokens"] == 12
    assert not os.path.exists(tiny.arm) and "set_kv_buffer" not in vars(tiny.pool)


def test_the_switch_is_read_with_the_others():
    switches = ProcessSwitches.from_environment({KERNEL_PROFILE: "/tmp/k.jsonl"})
    assert switches.kernel_profile == "/tmp/k.jsonl"
    assert ProcessSwitches.from_environment({}).kernel_profile is None


# -- a real CPU engine -----------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_with_profile(tiny_llama_path, tmp_path_factory):
    from prefillonly_sgl import Engine

    folder = tmp_path_factory.mktemp("kernel-profile")
    log, profile = folder / "forwards.log", folder / "kernels.jsonl"
    saved = {name: os.environ.get(name) for name in (FORWARD_LOG, KERNEL_PROFILE)}
    os.environ[FORWARD_LOG], os.environ[KERNEL_PROFILE] = str(log), str(profile)
    try:
        engine = Engine(tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=4096)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    with engine:
        yield engine, log, profile


def test_a_cpu_engine_profiles_the_armed_forwards(engine_with_profile, yes_no_labels):
    """Unarmed, nothing is profiled; armed with 2, the next two forwards are (one line
    each, every stage of this model's forward seen through its module ranges), the arm
    file goes, and the forward log still has one line per forward."""
    engine, log, profile = engine_with_profile
    query, items = list(range(20, 120)), [[130, 131], [140, 141, 142], [150]]
    engine.score(query, items, yes_no_labels)
    assert not profile.exists()
    arm = str(profile) + ".arm"
    with open(arm, "w") as f:
        f.write("2")
    before = len(read_events(log, "forward"))
    engine.score(list(range(200, 260)), items, yes_no_labels)  # a cold query: 1 forward
    engine.score(list(range(200, 260)), items, yes_no_labels)  # cached: 1 forward
    engine.score(query, items, yes_no_labels)  # not profiled
    forwards = read_events(log, "forward")[before:]
    assert len(forwards) == 3 and not os.path.exists(arm)
    lines = _lines(profile)
    assert len(lines) == 2
    assert [line["tokens"] for line in lines] == [sum(f["new"]) for f in forwards[:2]]
    assert [line["requests"] for line in lines] == [3, 3]
    for line in lines:
        assert line["device"] == "cpu" and line["module_ranges"] is True
        stages = line["stages_ms"]
        for stage in ("attention", "kv_write", "gemm", "norm_rotary_act", "logits"):
            assert stages[stage] > 0, (stage, line)
        assert sum(stages.values()) == pytest.approx(line["device_ms"], abs=1e-2)
        assert 0 < line["device_ms"] and line["host_ms"] >= 0 and line["kernels"]
