"""The kernel profile (an instrument): where an extend forward's time goes, by stage, on
request. PREFILLONLY_KERNEL_PROFILE names a file; while it is set the scheduler hook
(scheduler_process._around_run_batch) checks at each extend forward whether
`<file>.arm` exists (one os.path.exists; nothing else happens without it). The arm file
holds a count N (empty or unreadable: 1; 0 or less: it is removed and nothing is
profiled; write it whole, e.g. to a temporary name then renamed); the next N extend
forwards then run under torch.profiler (CPU activity, and CUDA's on CUDA: the CPU side
is what ties a kernel to the module it was launched from), one JSON line each is appended
to the file, and the arm file is removed once the N-th line is written: its absence says
the profile is complete. Should the profiler fail, the step runs unprofiled and its line
is {"tokens", "requests", "device", "error": "<exception>"}.

    {"tokens": int, "requests": int, "device": "cuda" | "cpu",
     "wall_ms": float, "launch_ms": float, "device_ms": float, "busy_ms": float,
     "host_ms": float, "module_ranges": bool,
     "stages_ms": {"attention": float, "merge": float, "kv_write": float, "gemm": float,
                   "norm_rotary_act": float, "logits": float, "other": float},
     "kernels": [[name, ms, count], ...]}          # the 15 longest, by total time

- tokens: the batch's new tokens (sum of extend_lens); requests: its requests.
- wall_ms: the step from its launch to the device's end: on CUDA the device is
  synchronised before the step (so nothing earlier is in it) and after it; on a CPU the
  step's host time. launch_ms: the host's time until run_batch returned.
- device_ms: the kernels' summed time on CUDA (CPU: the top-level ops' time);
  busy_ms: the time at least one ran; host_ms = wall_ms - busy_ms: the part of the step
  when the device ran nothing, waiting for the host (stages.py).
- stages_ms: device_ms by stage (stages.py: the classification and its rules).
- module_ranges: whether the kernels were seen inside module ranges (a forward replayed
  as a CUDA graph runs no module's Python: the name alone classifies, logits in gemm).

What profiling costs the profiled forwards (not the others): the profiler records every
op on the host, so their launch_ms and host_ms are higher than an unprofiled forward's
(compare systems profiled alike; the forward log's step_s is the unprofiled host time);
the two synchronisations end SGLang's CPU/GPU overlap for that step; and summarising the
events (a few hundred ms for a large model) delays the next step. The first profiled
forward of a process also starts the profiler's machinery (outside wall_ms).
"""

from __future__ import annotations

import json
import os
import time

from prefillonly_sgl.sglang_runtime.forward_profile.stages import (
    RANGE_PREFIX,
    Row,
    module_kind,
    summarize,
)

ARM_SUFFIX = ".arm"

_state = {"left": 0}  # forwards still to profile since the arm file was read


def _count_in(arm: str) -> int:
    try:
        with open(arm) as f:
            text = f.read().strip()
    except OSError:
        return 0  # removed between the check and the read: not armed
    try:
        return int(text) if text else 1
    except ValueError:
        return 1


def _disarm(arm: str) -> None:
    try:
        os.remove(arm)
    except FileNotFoundError:
        pass


def armed(path: str) -> bool:
    """Whether this extend forward is to be profiled (one os.path.exists when not)."""
    if _state["left"] > 0:
        return True
    arm = path + ARM_SUFFIX
    if not os.path.exists(arm):
        return False
    _state["left"] = _count_in(arm)
    if _state["left"] <= 0:
        _state["left"] = 0
        _disarm(arm)
        return False
    return True


class ModuleRanges:
    """Profiler ranges (record_function "prefillonly::<kind>") around the model's modules
    of a known kind and the KV pool's set_kv_buffer, for the profiled forwards only:
    installed before, removed after."""

    def __init__(self, model, pool) -> None:
        from torch.autograd.profiler import record_function

        self._handles = []
        self._pool = None
        self._pool_own = None
        if model is not None:
            for module in model.modules():
                kind = module_kind(type(module).__name__)
                if kind is None:
                    continue
                name = RANGE_PREFIX + kind

                def pre(mod, _args, name=name):
                    scope = record_function(name)
                    scope.__enter__()
                    mod.__dict__.setdefault("_prefillonly_ranges", []).append(scope)

                def post(mod, _args, _out):
                    scopes = mod.__dict__.get("_prefillonly_ranges")
                    if scopes:
                        scopes.pop().__exit__(None, None, None)

                self._handles.append(module.register_forward_pre_hook(pre))
                self._handles.append(module.register_forward_hook(post, always_call=True))
        if pool is not None and callable(getattr(pool, "set_kv_buffer", None)):
            original = pool.set_kv_buffer
            self._pool, self._pool_own = pool, pool.__dict__.get("set_kv_buffer")

            def set_kv_buffer(*args, **kwargs):
                with record_function(RANGE_PREFIX + "kv_write"):
                    return original(*args, **kwargs)

            try:
                pool.set_kv_buffer = set_kv_buffer
            except AttributeError:  # a pool without an instance __dict__
                self._pool = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._pool is not None:
            if self._pool_own is None:
                del self._pool.set_kv_buffer
            else:
                self._pool.set_kv_buffer = self._pool_own
            self._pool = None


def _ranges_of(event) -> tuple[str, ...]:
    """The kernel profile's ranges an op ran inside, outermost first."""
    kinds = []
    parent = event
    while parent is not None:
        if parent.name.startswith(RANGE_PREFIX):
            kinds.append(parent.name[len(RANGE_PREFIX) :])
        parent = parent.cpu_parent
    return tuple(reversed(kinds))


_RANGE_ACTIVITIES = ("user_annotation", "gpu_user_annotation")


def rows_of(events, cuda: bool) -> list[Row]:
    """The profiled step's rows (stages.Row) from torch.profiler's events: on CUDA each
    kernel (and memcpy / memset) on the device, with the ranges of the op that launched
    it (the kernel's linked correlation id is that op's id); on a CPU each top-level op
    (no op above it, ranges aside) with its inclusive time."""
    from torch.autograd import DeviceType

    def is_range(e) -> bool:
        return bool(e.is_user_annotation) or getattr(e, "activity_type", None) in (
            _RANGE_ACTIVITIES
        )

    # the ops and ranges on the host (not the CUDA runtime's calls, whose ids are
    # CUPTI's and link to an op themselves)
    ops = [
        e
        for e in events
        if e.device_type == DeviceType.CPU
        and not e.is_async
        and not getattr(e, "linked_correlation_id", 0)
        and getattr(e, "activity_type", None) in (None, "cpu_op", *_RANGE_ACTIVITIES)
    ]
    rows = []
    if cuda:
        by_id = {e.id: e for e in ops}
        for e in events:
            if e.device_type != DeviceType.CUDA or is_range(e):
                continue
            if e.name.startswith(RANGE_PREFIX):
                continue  # a range's span on the device, not a kernel
            op = by_id.get(e.linked_correlation_id)
            kinds = _ranges_of(op) if op is not None else ()
            rows.append(Row(e.name, e.time_range.start, e.time_range.end, kinds))
        return rows
    for e in ops:
        if is_range(e) or e.name.startswith(("[", RANGE_PREFIX)):
            continue
        parent = e.cpu_parent
        while parent is not None and is_range(parent):
            parent = parent.cpu_parent
        if parent is None:
            rows.append(Row(e.name, e.time_range.start, e.time_range.end, _ranges_of(e)))
    return rows


def profile_step(path: str, scheduler, batch, step):
    """Runs `step` (the scheduler's run_batch of this extend batch) under torch.profiler
    and appends its line to `path`; after the armed count's last line, the arm file goes.
    Should the profiler fail, the step runs (once) all the same and the line says why
    ("error"): the instrument never stops the engine."""
    _state["left"] -= 1
    try:
        return _profiled(path, scheduler, batch, step)
    finally:
        if _state["left"] <= 0:
            _state["left"] = 0
            _disarm(path + ARM_SUFFIX)


def _profiled(path: str, scheduler, batch, step):
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = str(getattr(scheduler, "device", "cpu")).startswith("cuda")
    head = {
        "tokens": sum(int(n) for n in batch.extend_lens),
        "requests": len(batch.reqs),
        "device": "cuda" if cuda else "cpu",
    }
    runner = getattr(getattr(scheduler, "tp_worker", None), "model_runner", None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        ranges = ModuleRanges(
            getattr(runner, "model", None), getattr(runner, "token_to_kv_pool", None)
        )
        prof = profile(activities=activities)
        if cuda:
            torch.cuda.synchronize()  # the previous step's work stays out of this one
        prof.__enter__()
    except Exception as error:
        if "ranges" in locals():
            ranges.remove()
        _append(path, {**head, "error": f"{type(error).__name__}: {error}"})
        return step()
    try:
        begin = time.perf_counter()
        result = step()
        launched = time.perf_counter() - begin
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - begin
    finally:
        prof.__exit__(None, None, None)
        ranges.remove()
    try:
        rows = rows_of(prof.events(), cuda)
        summary = summarize(rows, wall * 1000)
    except Exception as error:
        _append(path, {**head, "error": f"{type(error).__name__}: {error}"})
        return result
    _append(
        path,
        {
            **head,
            "wall_ms": summary.pop("wall_ms"),
            "launch_ms": round(launched * 1000, 4),
            **summary,
            "module_ranges": any(row.kinds for row in rows),
        },
    )
    return result


def _append(path: str, line: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
