"""Where a forward's time goes, by stage: the kernel profile's classification of CUDA
kernel names and CPU op names, and its summary of one profiled forward (plain Python: no
SGLang, no torch; kernel_profile.py feeds it the profiler's events).

Stages:

    attention        the attention kernels (FlashInfer's BatchPrefillWithRaggedKVCacheKernel /
                     BatchPrefillWithPagedKVCacheKernel / SinglePrefillWithKVCacheKernel /
                     decode kernels, flash-attention, cuDNN / PyTorch fmha; on a CPU
                     aten::scaled_dot_product_attention and everything our torch attention
                     backend runs inside a RadixAttention module: masks, gathers, bmm)
    merge            FlashInfer's MergeState / MergeStates / MergeStateInPlace kernels
                     (flashinfer.merge_state): ragged + paged passes joined
    kv_write         what the pool's set_kv_buffer launches: SGLang 0.5.23's
                     MHATokenToKVPool writes through its JIT store_cache op (kernel
                     store_kvcache_kernel) where it loads, else through torch,
                     k_cache[loc] = k (aten::index_put_: CUDA kernel
                     index_elementwise_kernel<... index_put_kernel_impl ...>), after a dtype
                     cast (a copy) when the pool's dtype differs
    gemm             GEMM kernels (cuBLAS / cuBLASLt: "gemm", "nvjet", "sm90_xmma",
                     "ampere_bf16", "cutlass"; CPU aten::mm / addmm / bmm / linear / matmul),
                     and everything launched inside a linear layer
    norm_rotary_act  RMSNorm / LayerNorm, rotary embedding, SiLU / GELU-and-mul: their fused
                     kernels by name, and on the torch fused-op path (the engine kit's) the
                     elementwise and reduction kernels they run
    logits           everything inside SGLang's LogitsProcessor (the LM head's GEMM among
                     them) and softmax / log-softmax kernels outside attention (the labels'
                     log-probabilities)
    other            the rest: embedding lookups, copies and casts, residual adds outside a
                     norm, memsets, index gathers

How a kernel is classified: during a profiled forward the hook opens a profiler range
(record_function "prefillonly::<kind>") around each module of a known kind and around the
pool's set_kv_buffer; a kernel knows the ranges its launching op ran inside (innermost
last). A LogitsProcessor or set_kv_buffer range decides alone; then names that say what a
kernel is (merge, attention, KV write) win; then the innermost module range (a cast inside
a linear layer is gemm, an add inside RMSNorm norm_rotary_act); then the name alone.
Without ranges (a forward replayed as a CUDA graph runs no module's Python) the name
decides: the LM head's GEMM is then counted in gemm, and torch's elementwise / reduction
kernels in norm_rotary_act (on the torch fused-op path most of them are; a residual add
outside a norm is counted there too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

STAGES = ("attention", "merge", "kv_write", "gemm", "norm_rotary_act", "logits", "other")

# The profiler ranges the kernel profile opens are named RANGE_PREFIX + kind.
RANGE_PREFIX = "prefillonly::"

# SGLang module class name -> kind. Leaves only (a linear layer inside an MLP is timed as
# "linear", the MLP itself not at all). The forward profile times these (module wall
# time); the kernel profile opens a range around them (module_kind: by suffix too).
KIND_OF_CLASS = {
    "QKVParallelLinear": "linear",
    "RowParallelLinear": "linear",
    "MergedColumnParallelLinear": "linear",
    "ColumnParallelLinear": "linear",
    "ReplicatedLinear": "linear",
    "RadixAttention": "attention",
    "RMSNorm": "norm",
    "RotaryEmbedding": "rotary",
    "Llama3RotaryEmbedding": "rotary",
    "SiluAndMul": "activation",
    "LogitsProcessor": "logits",
    "VocabParallelEmbedding": "embedding",
}

STAGE_OF_KIND = {
    "linear": "gemm",
    "attention": "attention",
    "norm": "norm_rotary_act",
    "rotary": "norm_rotary_act",
    "activation": "norm_rotary_act",
    "logits": "logits",
    "embedding": "other",
    "kv_write": "kv_write",
}


def module_kind(class_name: str) -> str | None:
    """The kind of a module class (KIND_OF_CLASS, then by its name's shape: any
    *Linear, *RotaryEmbedding, *RMSNorm / *LayerNorm, *AndMul), or None."""
    kind = KIND_OF_CLASS.get(class_name)
    if kind is not None:
        return kind
    if class_name.endswith("Linear"):
        return "linear"
    if class_name.endswith("RotaryEmbedding"):
        return "rotary"
    if class_name.endswith(("RMSNorm", "LayerNorm")):
        return "norm"
    if class_name.endswith("AndMul"):
        return "activation"
    return None


# Names, lower-cased substrings, in the order they are tried.
_MERGE = ("mergestate", "merge_state")
_ATTENTION = (
    "batchprefillwith",
    "prefillwithkvcache",
    "batchdecodewith",
    "decodewithkvcache",
    "flash_fwd",
    "flashattn",
    "flash_attn",
    "fmha",
    "scaled_dot_product",
    "attention",
)
_KV_WRITE = ("store_kvcache", "storekvcache", "store_cache", "set_kv_buffer", "index_put")
_GEMM = (
    "gemm",
    "nvjet",
    "xmma",
    "cublas",
    "cutlass",
    "ampere_bf16",
    "ampere_fp16",
    "splitk",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "mkldnn_",
)
_COPY = ("copy", "memset", "fill", "cat", "index", "embedding", "gather", "arange")
_LOGITS = ("softmax", "logsumexp", "log_softmax")
_NORM_ROTARY_ACT = (
    "rmsnorm",
    "rms_norm",
    "layernorm",
    "layer_norm",
    "rotary",
    "rope",
    "silu",
    "gelu",
    "and_mul",
    "andmul",
    "swiglu",
    "sigmoid",
    "rsqrt",
    "pow",
    "mean",
    "mul",
    "add",
    "neg",
    "elementwise_kernel",  # torch's: vectorized_ / unrolled_elementwise_kernel
    "reduce_kernel",
)


def _has(name: str, needles: Sequence[str]) -> bool:
    return any(n in name for n in needles)


def stage_of(name: str, kinds: Sequence[str] = ()) -> str:
    """The stage of a CUDA kernel or CPU op called `name`, launched inside the kernel
    profile's ranges `kinds` (outermost first; module docstring for the rules)."""
    low = name.lower()
    if "logits" in kinds:
        return "logits"
    if "kv_write" in kinds:
        return "kv_write"
    if _has(low, _MERGE):
        return "merge"
    if _has(low, _ATTENTION):
        return "attention"
    if _has(low, _KV_WRITE):
        return "kv_write"
    if kinds:
        return STAGE_OF_KIND.get(kinds[-1], "other")
    if _has(low, _GEMM):
        return "gemm"
    if _has(low, _LOGITS):
        return "logits"
    if _has(low, _COPY):
        return "other"
    if _has(low, _NORM_ROTARY_ACT):
        return "norm_rotary_act"
    return "other"


@dataclass(frozen=True)
class Row:
    """One kernel on the device (CUDA), or one top-level op on the host (CPU): its name,
    start and end in microseconds, and the kernel profile's ranges it ran inside."""

    name: str
    start_us: float
    end_us: float
    kinds: tuple[str, ...] = ()

    @property
    def us(self) -> float:
        return max(0.0, self.end_us - self.start_us)


def busy_us(rows: Iterable[Row]) -> float:
    """Microseconds during which at least one row ran (the union of their intervals)."""
    total, end = 0.0, None
    for row in sorted(rows, key=lambda r: r.start_us):
        if end is None or row.start_us > end:
            total += row.us
            end = row.end_us
        elif row.end_us > end:
            total += row.end_us - end
            end = row.end_us
    return total


NAME_CHARS = 200  # a kernel's name in the table (templated CUDA names run to thousands)
TOP_KERNELS = 15


def summarize(rows: Sequence[Row], wall_ms: float, top: int = TOP_KERNELS) -> dict:
    """One profiled forward's line, less its tokens and requests:

    device_ms  the rows' summed time (kernels overlapping on two streams count twice)
    busy_ms    the time at least one ran
    stages_ms  device_ms by stage, every stage present
    host_ms    wall_ms - busy_ms: the part of the step when nothing ran on the device
               (on CUDA: the device waiting for the host's launches; on a CPU: Python
               and the scheduler's own work between the ops)
    kernels    the `top` names by time: [name (cut to NAME_CHARS), ms, count]
    """
    stages = dict.fromkeys(STAGES, 0.0)
    by_name: dict[str, list] = {}
    for row in rows:
        stages[stage_of(row.name, row.kinds)] += row.us
        entry = by_name.setdefault(row.name, [0.0, 0])
        entry[0] += row.us
        entry[1] += 1
    device_us = sum(stages.values())
    busy = busy_us(rows)
    kernels = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms": round(wall_ms, 4),
        "device_ms": round(device_us / 1000, 4),
        "busy_ms": round(busy / 1000, 4),
        "host_ms": round(max(0.0, wall_ms - busy / 1000), 4),
        "stages_ms": {stage: round(us / 1000, 4) for stage, us in stages.items()},
        "kernels": [[name[:NAME_CHARS], round(us / 1000, 4), n] for name, (us, n) in kernels],
    }
