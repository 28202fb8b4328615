"""Memory probe (an instrument, not a feature): when the runtime configuration names a
file (WorkerConfig.memory_probe), the scheduler appends one JSON line per extend forward:
its tokens, the memory resident just before it and the peak during it. Set only by the
memory-budget calibration (memory/measurement.py), in an engine of its own.

    scheduler_process.py     the hook around ModelRunner.forward
"""

from __future__ import annotations

from prefillonly_sgl.hooking.hooks import register_hooks


def register() -> None:
    """Plugin entry (every SGLang process; acts in the scheduler, where the model runs)."""
    from prefillonly_sgl.sglang_runtime.memory_probe import scheduler_process

    register_hooks("memory_probe.scheduler_process", scheduler_process.HOOKS)
