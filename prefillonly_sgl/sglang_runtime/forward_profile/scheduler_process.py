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
each:

    {"event": "forward", "prefix": [int, ...], "new": [int, ...], "packed": int,
     "step_s": float, "t": float, "device_ms": float}

- prefix / new: each request's cached and newly computed tokens (SGLang's prefix_lens,
  extend_lens); packed: how many of them were followers.
- step_s: host seconds of Scheduler.run_batch (the launch; on a CUDA scheduler that
  overlaps, the host returns before the device is done).
- t: wall-clock time (time.time()) when the forward was launched, taken before it.
- device_ms (CUDA only): milliseconds between two torch.cuda.Event(enable_timing=True)
  recorded on the stream the forward runs on (the model runner's forward stream when
  SGLang overlaps, after that stream's wait for the schedule stream that run_batch makes
  anyway; the scheduler's current stream otherwise), one before run_batch and one after
  it: the device span of the step's forward-stream work (the forward, the label logprobs),
  gaps where the device waited for the host's launches included. No sync is added: the
  line is held until its end event has completed (event.query(): device_time.py) and
  written at a later run_batch, after a later batch's results are processed, or when the
  scheduler goes idle (Scheduler.on_idle, where it waits on the event) or the process
  exits (atexit; a worker killed with SIGKILL mid-run loses its held lines). On a CPU
  there are no events: the line is written at once, without device_ms. Lines keep the
  forwards' launch order.

The kernel profile (PREFILLONLY_KERNEL_PROFILE, kernel_profile.py): at each extend
forward, one os.path.exists of `<file>.arm`; when it is there, the next N extend steps
run under torch.profiler and their stage table goes to the file (stages.py)."""

from __future__ import annotations

import atexit
import json
import time

from prefillonly_sgl.features.prefill_kv.packing import FOLLOWER_MARK
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event
from prefillonly_sgl.sglang_runtime.forward_profile import kernel_profile
from prefillonly_sgl.sglang_runtime.forward_profile.device_time import HeldForwards
from prefillonly_sgl.sglang_runtime.forward_profile.stages import KIND_OF_CLASS

_state = {"installed": False, "times": {}, "plan": 0.0}

# Forward-log lines waiting for their forward's end event on the device (CUDA only).
_HELD = HeldForwards()
_exit_flush = {"registered": False}


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


def _device_stream(scheduler):
    """The stream Scheduler.run_batch launches the forward on (None on a CPU): the model
    runner's forward stream when SGLang overlaps (run_batch enters it), else the stream
    the event loop runs on (SGLang's schedule stream, the current one)."""
    if not str(getattr(scheduler, "device", "cpu")).startswith("cuda"):
        return None
    import torch

    if getattr(scheduler, "enable_overlap", False):
        return scheduler.forward_stream
    return torch.cuda.current_stream()


def _logged_step(path, scheduler, batch, step):
    """One forward-log line for this extend step (module docstring): written now on a CPU,
    held until its end event completes on CUDA."""
    # counted before the forward: a follower's mark goes at its release
    packed = sum(hasattr(req, FOLLOWER_MARK) for req in batch.reqs)
    launched = time.time()
    stream = _device_stream(scheduler)
    if stream is not None:
        import torch

        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if getattr(scheduler, "enable_overlap", False):
            # run_batch's own first step on the forward stream (a stream-to-stream wait,
            # not a host one): the start event then fires when this forward can begin
            stream.wait_stream(scheduler.schedule_stream)
        start.record(stream)
    begin = time.perf_counter()
    result = step()
    fields = dict(
        prefix=_ints(batch.prefix_lens),
        new=_ints(batch.extend_lens),
        packed=packed,
        step_s=round(time.perf_counter() - begin, 6),
        t=round(launched, 4),  # when it was launched: a run's queueing, rebuilt
    )
    if stream is None:
        append_event(path, "forward", **fields)
    else:
        end.record(stream)
        _HELD.hold(path, fields, start, end)
        if not _exit_flush["registered"]:
            atexit.register(_HELD.flush)
            _exit_flush["registered"] = True
    return result


def _around_run_batch(original, self, batch, *args, **kwargs):
    if _HELD:
        _HELD.write_completed()  # earlier forwards' lines whose end event has completed
    switches = process_state.current().switches
    path = switches.forward_profile
    if not batch.forward_mode.is_extend():
        return original(self, batch, *args, **kwargs)

    def step():
        return original(self, batch, *args, **kwargs)

    kernels = switches.kernel_profile
    if kernels and kernel_profile.armed(kernels):  # one os.path.exists when not armed
        run = step

        def step():
            return kernel_profile.profile_step(kernels, self, batch, run)

    if not path:
        if not switches.forward_log:
            return step()
        return _logged_step(switches.forward_log, self, batch, step)
    _state.pop("last", None)
    start = time.perf_counter()
    result = step()
    step = time.perf_counter() - start
    record = _state.pop("last", None)
    if record is not None:
        record["step_s"] = step
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    return result


def _after_process_batch_result(result, self, *args, **kwargs):
    """The batch's results are on the host, so its forward has ended: its line (and any
    before it) goes now, before the scheduler's next step (query() only)."""
    if _HELD:
        _HELD.write_completed()
    return result


def _before_on_idle(self, *args, **kwargs):
    """The scheduler has nothing to run: every held line is written (waiting on its end
    event, which has normally completed by then)."""
    if _HELD:
        _HELD.flush()


HOOKS = {
    "sglang.srt.managers.scheduler.Scheduler.run_batch": ("AROUND", _around_run_batch),
    "sglang.srt.managers.scheduler.Scheduler.process_batch_result": (
        "AFTER",
        _after_process_batch_result,
    ),
    "sglang.srt.managers.scheduler.Scheduler.on_idle": ("BEFORE", _before_on_idle),
    "sglang.srt.model_executor.model_runner.ModelRunner.forward": ("AROUND", _around_forward),
}
