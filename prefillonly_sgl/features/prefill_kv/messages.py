"""What prefill-only KV sends between SGLang's processes (plain Python): each value that
crosses a process boundary is written and read here, and nowhere else.

- tokenizer process -> scheduler, per request: the reusable-prefix length R (policy.py),
  in SamplingParams.custom_params, SGLang's per-request JSON dict that travels with the
  request; absent for every request that is not a score prompt (those stay stock). Where
  a prompt keeps more than the prefix it shares with its call's other prompts (labels of
  several tokens keep whole prompts for their continuations), also that shared length,
  by which the JCT scheduler groups it (the call's prompts then run as one group: one
  computes the query, the others ride behind it in the same forward).
- tokenizer process -> scheduler, per score prompt: its call's id and number of prompts,
  by which the JCT scheduler admits a call's prompts together where SGLang sends them
  one by one (jct_scheduler/call_arrival.py).
- scheduler -> main process, once at start-up: the longest score prompt this scheduler
  accepts, in SGLang's start-up handshake (Scheduler.get_init_info), present only where
  prefill-only KV is active. The Engine and the server validate with it. Where the
  feature was asked for and is off, why (the same handshake): the Engine's warning names
  it, whatever SGLang's log level.
"""

from __future__ import annotations

REUSABLE_LEN_KEY = "prefillonly_reusable_len"
SHARED_LEN_KEY = "prefillonly_shared_len"
CALL_KEY = "prefillonly_call"
SCORING_LIMIT_KEY = "prefillonly_max_scoring_input_len"
OFF_REASON_KEY = "prefillonly_kv_off_because"


def with_reusable_len(custom_params: dict | None, reusable_len: int) -> dict:
    """custom_params (a copy) carrying R."""
    return {**(custom_params or {}), REUSABLE_LEN_KEY: int(reusable_len)}


def reusable_len_in(custom_params: object) -> int | None:
    """R as the tokenizer process sent it, or None (not a score prompt). The scheduler
    reads it in its own loop, where an exception stops the engine, and custom_params also
    come from clients (SGLang's /generate): a value that is not a number reads as None,
    the request then runs as stock SGLang runs it."""
    if not isinstance(custom_params, dict) or REUSABLE_LEN_KEY not in custom_params:
        return None
    return _length(custom_params[REUSABLE_LEN_KEY])


def with_shared_len(custom_params: dict | None, shared_len: int) -> dict:
    """custom_params (a copy) carrying the prefix the prompt shares with its call's others,
    where it keeps more (R > shared_len)."""
    return {**(custom_params or {}), SHARED_LEN_KEY: int(shared_len)}


def grouping_len_in(custom_params: object) -> int | None:
    """The prefix the JCT scheduler groups a prompt by: the shared length where one was
    sent, else R; None: not a score prompt."""
    if isinstance(custom_params, dict) and SHARED_LEN_KEY in custom_params:
        shared = _length(custom_params[SHARED_LEN_KEY])
        if shared is not None:
            return shared
    return reusable_len_in(custom_params)


def with_call(custom_params: dict | None, call_id: str, prompts: int) -> dict:
    """custom_params (a copy) carrying the score call's id and its number of prompts."""
    return {**(custom_params or {}), CALL_KEY: [str(call_id), int(prompts)]}


def call_in(custom_params: object) -> tuple[str, int] | None:
    """(call id, prompts) as the tokenizer process sent them, or None (anything else:
    custom_params also come from clients, and a malformed value reads as absent)."""
    if not isinstance(custom_params, dict):
        return None
    value = custom_params.get(CALL_KEY)
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str):
        return None
    size = _length(value[1])
    return None if size is None or size < 1 else (value[0], size)


def _length(value: object) -> int | None:
    """A length read from custom_params (int() of it, as it always was read), or None
    where int() refuses it (a string, a list, NaN, an infinity)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def with_scoring_limit(init_info: dict, max_input_len: int) -> dict:
    """The handshake (a copy) carrying the score-prompt limit, in SGLang's form: the
    scheduler refuses a prompt of len >= max_input_len."""
    return {**init_info, SCORING_LIMIT_KEY: int(max_input_len)}


def scoring_limit_in(init_info: dict) -> int | None:
    value = init_info.get(SCORING_LIMIT_KEY)
    return int(value) if value else None


def with_off_reason(init_info: dict, reason: str) -> dict:
    """The handshake (a copy) saying why prefill-only KV is off in this scheduler."""
    return {**init_info, OFF_REASON_KEY: str(reason)}


def off_reason_in(info: dict) -> str | None:
    value = info.get(OFF_REASON_KEY)
    return str(value) if value else None
