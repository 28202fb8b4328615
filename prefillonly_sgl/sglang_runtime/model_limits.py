"""The validation limits of a running SGLang engine or server, from what its scheduler
reported when it started (SGLang's init handshake), so that the offline Engine and the
HTTP server refuse exactly what the scheduler would refuse."""

from __future__ import annotations

from prefillonly_sgl.features.prefill_kv.messages import scoring_limit_in
from prefillonly_sgl.scoring.validation import ModelLimits


def limits_from_scheduler_info(scheduler_info: dict, vocab_size: int) -> ModelLimits:
    # SGLang refuses a prompt of len >= max_req_input_len (managers/utils.py
    # validate_input_length), so the longest it accepts is one less.
    max_prompt = int(scheduler_info["max_req_input_len"]) - 1
    scoring = scoring_limit_in(scheduler_info)  # only where prefill-only KV is active
    return ModelLimits(
        vocab_size=int(vocab_size),
        max_prompt_tokens=max_prompt,
        max_scoring_prompt_tokens=max(max_prompt, scoring - 1) if scoring else None,
    )
