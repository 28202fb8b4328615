"""Prompt logprobs through the prefix cache (plugin feature "prompt_logprobs"): echo
requests' per-position entries kept in a side table indexed by KV slot
(docs/loglikelihood.md).

    scheduler_process.py          the scheduler hooks and ``register()``
    ../../prompt_logprobs/        the table, the plan and the settings (plain torch)
"""

from __future__ import annotations

from prefillonly_sgl.sglang_runtime.prompt_logprobs.scheduler_process import register

__all__ = ["register"]
