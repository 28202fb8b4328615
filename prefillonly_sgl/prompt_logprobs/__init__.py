"""Prompt logprobs (echo + logprobs requests, what evaluation harnesses send) served
through the prefix cache (plugin feature "prompt_logprobs").

    table.py      per KV slot: its token's logprob and its position's top-k (plain torch)
    plan.py       which positions a request reads from the table, and the splice (plain)
    settings.py   the chunk size of the prompt-logprob computation, to the scheduler
    ../sglang_runtime/prompt_logprobs/scheduler_process.py   the scheduler hooks
"""
