"""Prefill-only KV (plugin feature "prefill_kv"): a score prompt keeps pool KV only for
its reusable prefix; the rest of its k/v live only while their own layer computes.

    kv/policy.py               which tokens keep KV (R, kept tokens, DROPPED_SLOT): plain
    kv/messages.py             R to the scheduler, the score limit back to the main process
    ../reusable_prefix.py      hooks in the TokenizerManager's process: R per score prompt
    scheduler_process.py       hooks in the scheduler: length limit, admission, allocation
    ../prefill_attention/   attention that never reads dropped tokens from the pool

Requires "prefill_attention" (features.py): stock attention reads new tokens back from
the pool.
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime import reusable_prefix
from prefillonly_sgl.sglang_runtime.hooks import register_hooks
from prefillonly_sgl.sglang_runtime.prefill_kv import scheduler_process


def register() -> None:
    """Plugin entry (every SGLang process): both tables; each acts only where its targets
    run (the tokenizer hooks in the main process, the scheduler hooks in the scheduler)."""
    register_hooks(reusable_prefix.HOOK_TABLE_NAME, reusable_prefix.HOOKS)
    register_hooks("prefill_kv.scheduler_process", scheduler_process.HOOKS)
