"""Prefill-only KV (feature "prefill_kv"): a score prompt keeps pool KV only for its
reusable prefix; the rest of its k/v live only while their own layer computes
(docs/prefill_only_kv.md).

    policy.py              which tokens keep KV (R, kept tokens, DROPPED_SLOT): plain
    messages.py            R to the scheduler, the score limit back to the main process
    tokenizer_process.py   hooks in the TokenizerManager's process (the Engine's or the
                           server's main process): R per score prompt (the JCT scheduler
                           registers them too)
    scheduler_process.py   hooks in the scheduler: length limit, admission, allocation

Requires "prefill_attention" (features/__init__.py): stock attention reads new tokens back from
the pool.
"""

from __future__ import annotations


def register() -> None:
    """Plugin entry (every SGLang process): both tables; each acts only where its targets
    run (the tokenizer hooks in the main process, the scheduler hooks in the scheduler)."""
    from prefillonly_sgl.features.prefill_kv import scheduler_process, tokenizer_process
    from prefillonly_sgl.hooking.hooks import register_hooks

    register_hooks(tokenizer_process.HOOK_TABLE_NAME, tokenizer_process.HOOKS)
    register_hooks("prefill_kv.scheduler_process", scheduler_process.HOOKS)
