"""The scoring contract: what `Engine.score` (and every front built on it) takes and gives
back, in plain Python (no SGLang, no torch at import).

    labels.py, label_trie.py   label sets compiled to token ids; labels of several tokens
    continuations.py           a continuation's token logprobs: the request and its checks
    appended_tokens.py         tokens after a text prompt (one with images) as exact text
    validation.py              checks on a score request before anything reaches SGLang
    score_result.py            ScoreResult, what one score call returns
    priors.py                  contextual calibration's arithmetic
    usage.py                   per-request usage (its wire views: wire/prefillonly.py)
    call_context.py            one call's settings (tenant, salt, adapter, usage record),
                               built where it enters, and their one carrier
    cache_salts.py             prefix-cache namespaces (tenants)
    adapters.py                LoRA adapters per call: names, the doors that take them
    reusable_prefix.py         how a request carries its reusable prefix to the tokenizer hook
    errors.py                  the exceptions every caller sees (PrefillOnlyError and kin)

Imports nothing of the package outside this folder: every other folder may import it.
"""
