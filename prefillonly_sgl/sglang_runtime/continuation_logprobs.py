"""Continuation log-probabilities on SGLang's TokenizerManager (what to send and why:
prefillonly_sgl/scoring/continuations.py, generate_fields).

One generate request per prompt, all in one batch, each a prefill-only request (no output
token). SGLang computes the logits and log-softmax of the positions from
logprob_start_len on only, and caps the prefix-cache match there, which costs one
recomputed position per prompt (the prompt's last).
"""

from __future__ import annotations

from prefillonly_sgl.scoring.continuations import (
    ContinuationPlan,
    generate_fields,
    token_logprobs_of,
)


async def continuation_logprobs(
    tokenizer_manager, plan: ContinuationPlan, request=None
) -> tuple[list[list[float]], int]:
    """(per prompt the continuation's token logprobs, prompt tokens SGLang reported)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    batch = GenerateReqInput(**generate_fields(plan), stream=False)
    outputs = await tokenizer_manager.generate_request(batch, request).__anext__()
    if isinstance(outputs, dict):  # SGLang answers a batch of one as a single request
        outputs = [outputs]
    rows = [
        token_logprobs_of(out["meta_info"]["input_token_logprobs"], length)
        for out, length in zip(outputs, plan.continuation_lengths(), strict=True)
    ]
    return rows, sum(int(out["meta_info"].get("prompt_tokens", 0)) for out in outputs)
