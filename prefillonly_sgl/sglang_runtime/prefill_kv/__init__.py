"""Prefill-only KV (plugin feature "prefill_kv"): a score prompt keeps pool KV only for
its reusable prefix; the rest of its k/v live only while their own layer computes.

    kv/policy.py             which tokens keep KV (R, kept tokens, DROPPED_SLOT): plain
    kv/messages.py           R to the scheduler, the score limit back to the main process
    tokenizer_process.py     hooks in the TokenizerManager's process: R per score prompt
    scheduler_process.py     hooks in the scheduler: length limit, admission, allocation
    ../prefill_attention*.py attention that never reads dropped tokens from the pool

Requires "prefill_attention" (features.py): stock attention reads new tokens back from
the pool.
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.hooks import apply_hooks_now, register_hooks
from prefillonly_sgl.sglang_runtime.prefill_kv import scheduler_process, tokenizer_process


def register() -> None:
    """Plugin entry (every SGLang process): both tables; each acts only where its targets
    run (the tokenizer hooks in the main process, the scheduler hooks in the scheduler)."""
    register_hooks("prefill_kv.tokenizer_process", tokenizer_process.HOOKS)
    register_hooks("prefill_kv.scheduler_process", scheduler_process.HOOKS)


def install_tokenizer_hooks() -> None:
    """Applies the tokenizer-process hooks in this process now.

    SGLang loads plugins once per process, so in a process that first started a stock
    engine (or imported SGLang's server before PREFILLONLY_PATCHES was set) the plugin
    never runs again; the Engine and `serve` call this before starting SGLang. The hooks
    then stay for later engines of this process too: a stock engine's score prompts carry
    R in custom_params, which its scheduler (without our hooks) ignores.
    """
    apply_hooks_now("prefill_kv.tokenizer_process", tokenizer_process.HOOKS)
