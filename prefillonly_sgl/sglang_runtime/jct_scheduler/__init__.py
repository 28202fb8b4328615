"""The JCT-aware scheduler (plugin feature "jct_scheduler"): shortest remaining job first on
a profiled job-time model, recalibrated every step against the prefix cache, with aging
and prefix-aware batches.

    scheduler/                  the decisions (plain Python): model, marks, policy, settings
    ../reusable_prefix.py       hooks in the TokenizerManager's process: R per score prompt
    scheduler_process.py        hooks in the scheduler: SGLang's policy and adder replaced
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime import reusable_prefix
from prefillonly_sgl.sglang_runtime.hooks import register_hooks


def register() -> None:
    """Plugin entry (every SGLang process)."""
    from prefillonly_sgl.sglang_runtime.jct_scheduler import scheduler_process

    register_hooks(reusable_prefix.HOOK_TABLE_NAME, reusable_prefix.HOOKS)
    register_hooks("jct_scheduler.scheduler_process", scheduler_process.HOOKS)
