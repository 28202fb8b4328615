"""The JCT-aware scheduler (feature "jct_scheduler"): shortest remaining job first on a
profiled job-time model, recalibrated every step against the prefix cache, with aging
and prefix-aware batches (docs/scheduler.md).

    jct_model.py, profiles.py, profiler.py   the job-time model and its saved profiles
    prefix_marks.py        what waiting requests share
    policy.py              the batch each prefill step runs (plain Python + numpy)
    eviction.py            queue-aware eviction's decisions
    simulate.py            the policy on a simulated clock and cache
    settings.py            its options, as the scheduler process receives them
    scheduler_process.py   hooks in the scheduler: SGLang's policy and adder replaced
    ../prefill_kv/tokenizer_process.py   hooks in the TokenizerManager's process: R per
                           score prompt (prefill-only KV's; both features register them)
"""

from __future__ import annotations


def register() -> None:
    """Plugin entry (every SGLang process)."""
    from prefillonly_sgl.features.jct_scheduler import scheduler_process
    from prefillonly_sgl.features.prefill_kv import tokenizer_process
    from prefillonly_sgl.hooking.hooks import register_hooks

    register_hooks(tokenizer_process.HOOK_TABLE_NAME, tokenizer_process.HOOKS)
    register_hooks("jct_scheduler.scheduler_process", scheduler_process.HOOKS)
