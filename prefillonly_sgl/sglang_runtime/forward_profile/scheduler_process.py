"""Forward profile, scheduler side: where an extend batch's time goes.

AROUND Scheduler.run_batch: the step's wall time (the forward, then the label logprobs).
AROUND ModelRunner.forward: the forward's wall time; on the first one, timers are put on
the model's modules by kind (forward pre/post hooks: the CPU runs synchronously, so wall
time between them is the module's time; on CUDA the step synchronises first) and on the
attention backend's init_forward_metadata (the plan, masks, index tensors). One JSON line
per extend batch goes to the file PREFILLONLY_FORWARD_PROFILE names.

Kinds are leaf modules, so nothing is counted twice: "other" is the forward minus them
(residual adds, reshapes, the model's own Python).

The forward log (PREFILLONLY_FORWARD_LOG, without the profile's timers and their
synchronisation): one "forward" event per extend forward (hooking/events.py), each
request's cached and new tokens, how many of its requests were followers packed behind
their leader (prefill_kv/packing.py), the step's seconds and its wall-clock time, so a
test or a benchmark counts the forwards a workload took, and the requests and tokens in
each."""

from __future__ import annotations

import json
import time

from prefillonly_sgl.features.prefill_kv.packing import FOLLOWER_MARK
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event

# SGLang module class name -> kind. Leaves only (a linear layer inside an MLP is timed as
# "linear", the MLP itself not at all).
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

_state = {"installed": False, "times": {}, "plan": 0.0}


def _clock(device_is_cuda: bool) -> float:
    if device_is_cuda:
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


def _install_timers(runner) -> None:
    cuda = str(runner.device).startswith("cuda")
    times = _state["times"]
    for module in runner.model.modules():
        kind = KIND_OF_CLASS.get(type(module).__name__)
        if kind is None:
            continue

        def pre(_module, _args):
            _module._prefillonly_t0 = _clock(cuda)

        def post(_module, _args, _out, kind=kind):
            times[kind] = times.get(kind, 0.0) + _clock(cuda) - _module._prefillonly_t0

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
    backend = runner.attn_backend
    original = backend.init_forward_metadata

    def timed_init(forward_batch):
        start = _clock(cuda)
        try:
            return original(forward_batch)
        finally:
            _state["plan"] += _clock(cuda) - start

    backend.init_forward_metadata = timed_init
    _state["installed"] = True
    _state["cuda"] = cuda


def _around_forward(original, self, forward_batch, *args, **kwargs):
    profiling = process_state.current().switches.forward_profile
    if not profiling or not forward_batch.forward_mode.is_extend():
        return original(self, forward_batch, *args, **kwargs)
    if not _state["installed"]:
        _install_timers(self)
    _state["times"].clear()
    _state["plan"] = 0.0
    start = _clock(_state["cuda"])
    result = original(self, forward_batch, *args, **kwargs)
    forward = _clock(_state["cuda"]) - start
    _state["last"] = dict(
        prefix=list(_ints(forward_batch.extend_prefix_lens_cpu)),
        new=list(_ints(forward_batch.extend_seq_lens_cpu)),
        forward_s=forward,
        plan_s=_state["plan"],
        modules_s=dict(_state["times"]),
    )
    return result


def _ints(values):
    return [int(v) for v in (values if values is not None else [])]


def _around_run_batch(original, self, batch, *args, **kwargs):
    switches = process_state.current().switches
    path = switches.forward_profile
    if not batch.forward_mode.is_extend():
        return original(self, batch, *args, **kwargs)
    if not path:
        if not switches.forward_log:
            return original(self, batch, *args, **kwargs)
        # counted before the forward: a follower's mark goes at its release
        packed = sum(hasattr(req, FOLLOWER_MARK) for req in batch.reqs)
        start = time.perf_counter()
        result = original(self, batch, *args, **kwargs)
        append_event(
            switches.forward_log,
            "forward",
            prefix=_ints(batch.prefix_lens),
            new=_ints(batch.extend_lens),
            packed=packed,
            step_s=round(time.perf_counter() - start, 6),
            t=round(time.time(), 4),  # when it was launched: a run's queueing, rebuilt
        )
        return result
    _state.pop("last", None)
    start = time.perf_counter()
    result = original(self, batch, *args, **kwargs)
    step = time.perf_counter() - start
    record = _state.pop("last", None)
    if record is not None:
        record["step_s"] = step
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    return result


HOOKS = {
    "sglang.srt.managers.scheduler.Scheduler.run_batch": ("AROUND", _around_run_batch),
    "sglang.srt.model_executor.model_runner.ModelRunner.forward": ("AROUND", _around_forward),
}
