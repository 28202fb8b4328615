"""Choice answers in OpenAI's response formats (plain Python; token texts come from a
``decode(token_id)`` passed in).

Each choice object is OpenAI's (chat: `message`; completions: `text`) with
`finish_reason` "stop" (the constraint's end, as a grammar ends the answer) and
`choice_probabilities` (answering.Answer.choice_probabilities). `logprobs`, when asked
for, lists every token of the answer: a choice's tokens with their log-probability over
the vocabulary (before the constraint and temperature, as vLLM reports logprobs by
default) and, as `top_logprobs`, the tokens the constraint allowed at that step, most
probable first; a token of fixed JSON text (punctuation, keys) is forced by the schema:
logprob 0.0 (certain under the constraint), not read from the model.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from prefillonly_sgl.choices.answering import Answer
from prefillonly_sgl.choices.selection import Step
from prefillonly_sgl.single_token.logprobs import text_offsets

Decode = Callable[[int], str]


def _logprob(step: Step) -> float:
    return 0.0 if step.logprob is None else step.logprob


def chat_logprobs(steps: Sequence[Step], top: int, decode: Decode) -> dict:
    def entry(token: int, logprob: float) -> dict:
        text = decode(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for step in steps:
        one = entry(step.token, _logprob(step))
        one["top_logprobs"] = [entry(t, lp) for t, lp in step.allowed[:top]]
        content.append(one)
    return {"content": content, "refusal": None}


def completion_logprobs(steps: Sequence[Step], top: int, decode: Decode) -> dict:
    tokens = [decode(step.token) for step in steps]
    rows = []
    for step, text in zip(steps, tokens):
        row = {decode(t): lp for t, lp in step.allowed[:top]}
        row.setdefault(text, _logprob(step))  # the answer's own token, as OpenAI adds it
        rows.append(row)
    return {
        "tokens": tokens,
        "token_logprobs": [_logprob(step) for step in steps],
        "top_logprobs": rows,
        "text_offset": text_offsets(tokens),
    }


def chat_choice(index: int, answer: Answer, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "message": {
            "role": "assistant",
            "content": answer.text,
            "reasoning_content": None,
            "tool_calls": None,
        },  # fmt: skip
        "logprobs": logprobs,
        "finish_reason": "stop",
        "choice_probabilities": answer.choice_probabilities(),
    }


def completion_choice(index: int, answer: Answer, logprobs: dict | None) -> dict:
    return {
        "index": index,
        "text": answer.text,
        "logprobs": logprobs,
        "finish_reason": "stop",
        "choice_probabilities": answer.choice_probabilities(),
    }


def usage(prompt_tokens: int, answers: Sequence[Answer], cached: int, computed: int) -> dict:
    """OpenAI's usage: the prompts' tokens, the answers' tokens, the prompts' tokens found
    in the prefix cache; `computed_tokens` (ours): every token the forwards computed (the
    prompts' uncached tokens and the choices' own tokens)."""
    completion = sum(len(a.tokens) for a in answers)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "computed_tokens": computed,
    }


def response(chat: bool, model: str, choices: list[dict], usage_: dict) -> dict:
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }
