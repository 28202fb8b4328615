"""Every prompt position's log-probability, asked the way lm-eval's echo requests ask it
(logprob_start_len 0, one forward, no output token): the requests the prompt-logprob
cache serves (features/prompt_logprobs/plan.py, caches_prompt_logprobs). `prefillonly
verify` checks that path against transformers (verification/verify.py)."""

from __future__ import annotations


async def echo_prompt_logprobs(tokenizer_manager, input_ids: list[int]) -> list[float | None]:
    """Each token's log-probability given the tokens before it (None for the first)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    request = GenerateReqInput(
        input_ids=list(input_ids),
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=0,
        stream=False,
    )
    out = await tokenizer_manager.generate_request(request, None).__anext__()
    return [entry[0] for entry in out["meta_info"]["input_token_logprobs"]]
