"""The reusable prefix of a single-token OpenAI request (plain Python, no SGLang).

What later requests can reuse is kept in the prefix cache; the rest of the prompt gets no
KV beyond its own forward (features/prefill_kv/policy.py). Per door:

- chat: the rendered template of every message before the last (system prompt, few-shot
  turns), i.e. the prompt up to where the last message starts. The template is rendered
  for those messages alone (without a generation prompt), and R is the common token
  prefix of that rendering and the real prompt, so a template that renders earlier turns
  differently once a later one follows only shortens R, never claims a wrong token.
- completions: what the request marks in `shared_prefix` (text or token ids every prompt
  starts with, as `/v1/score`'s query marks it); without it, a request of several
  prompts shares their common prefix; a single unmarked prompt keeps nothing new (it
  reuses only what the prefix cache already holds).

The prefix travels from the HTTP handler to the tokenizer hook inside the request's
`custom_params` (scoring/reusable_prefix.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence


def chat_prefix_messages(messages: Sequence[dict]) -> list[dict]:
    """The messages whose rendering every request with the same history shares."""
    return list(messages[:-1])


def completion_prefix(prompt: object, shared_prefix: object) -> str | list[int] | None:
    """The text or token ids the request's prompts share (None: nothing marked)."""
    if shared_prefix is not None:
        return shared_prefix
    if not isinstance(prompt, list) or len(prompt) < 2:
        return None
    if all(isinstance(p, str) for p in prompt):
        return os.path.commonprefix(prompt) or None
    if all(isinstance(p, list) for p in prompt):
        first = prompt[0]
        n = min(len(p) for p in prompt)
        for i in range(n):
            if any(p[i] != first[i] for p in prompt):
                n = i
                break
        return list(first[:n]) or None
    return None  # a single list of token ids: one prompt


def prefix_token_ids(
    prefix: str | list[int] | None, encode: Callable[[str], list[int]]
) -> list[int]:
    """The prefix as token ids ([] when there is none: only cached tokens are reused)."""
    if prefix is None:
        return []
    if isinstance(prefix, str):
        return list(encode(prefix))
    return list(prefix)
