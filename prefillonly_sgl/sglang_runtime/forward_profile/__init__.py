"""Forward profile (an instrument, not a feature): when PREFILLONLY_FORWARD_PROFILE names a
file, the scheduler appends one JSON line per extend batch: its requests' prefix and new
tokens, the wall seconds of the scheduler's step (the forward, the label logprobs), of
the forward itself, of the attention plan, and of each kind of module inside the forward
(linear layers, attention, norms, rotary, activation, logits). Set by
benchmarks/forward_profile.py, in an engine of its own; the module timers add ~1 ms per
forward.

The forward log (PREFILLONLY_FORWARD_LOG) rides on the same hooks: one line per extend
forward, with its device time on CUDA (scheduler_process.py's docstring has the shape).
So does the kernel profile (PREFILLONLY_KERNEL_PROFILE): when `<file>.arm` names a count,
that many extend forwards under torch.profiler, one stage table each (kernel_profile.py).

    scheduler_process.py     the hooks around Scheduler.run_batch and ModelRunner.forward,
                             after process_batch_result, before on_idle
    device_time.py           forward-log lines held until their forward's end event has
                             completed on the device (query() only), flushed at idle
    kernel_profile.py        the kernel profile: arming, module ranges, the profiled step
    stages.py                kernel and op names by stage, one forward's summary (plain)
"""

from __future__ import annotations

from prefillonly_sgl.hooking.hooks import register_hooks


def register() -> None:
    """Plugin entry (every SGLang process; acts in the scheduler, where the model runs)."""
    from prefillonly_sgl.sglang_runtime.forward_profile import scheduler_process

    register_hooks("forward_profile.scheduler_process", scheduler_process.HOOKS)
