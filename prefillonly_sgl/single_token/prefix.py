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
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import orjson


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


class _PrefixCache:
    """Token ids of rendered chat histories (a system prompt and few-shot turns recur
    across many requests): rendered once, LRU-bounded; thread-safe."""

    def __init__(self, size: int = 512) -> None:
        self._ids: OrderedDict[bytes, list[int]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: bytes, compute) -> list[int]:
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
                return ids
        ids = compute()
        with self._lock:
            self._ids[key] = ids
            if len(self._ids) > self._size:
                self._ids.popitem(last=False)
        return ids


_CHAT_PREFIXES = _PrefixCache()


def _message_dict(message) -> dict:
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else message
    content = data.get("content")
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        data = {**data, "content": "".join(p.get("text", "") for p in content)}
    return data


def chat_prefix_ids(tokenizer, request) -> list[int]:
    """The token ids of a chat request's history before the last message (its `messages`,
    `tools` and `chat_template_kwargs` rendered by the tokenizer's template; [] when there
    is none or the template cannot render it alone: then only cached tokens are reused)."""
    messages = [_message_dict(m) for m in chat_prefix_messages(request.messages)]
    if not messages:
        return []
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
    kwargs = dict(request.chat_template_kwargs or {})
    try:
        key = orjson.dumps([messages, tools, kwargs], option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return []

    def render() -> list[int]:
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=False, tools=tools, **kwargs
            )
            return list(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # a template that needs the whole conversation: nothing marked
            return []

    return _CHAT_PREFIXES.get(key, render)
