"""Moderation as scoring (issue 85; docs/moderation.md): OpenAI's `/v1/moderations` answered
by an open guard model's verdict probabilities, read off the prefill, never decoded.
Plain Python:

    taxonomies.py   each guard's categories and the OpenAI keys they answer (the table)
    readout.py      how a verdict and its categories are read: texts, chain rule, shares
    plan.py         a moderation call as score requests (one prefill of what the prompts
                    share) and their rows back into each input's result
    guard_prompts.py  the prompts: the guard's own chat template, or the policy classifier's

Imports scoring/ only; the SGLang side is sglang_runtime/moderation_calls.py.
"""
