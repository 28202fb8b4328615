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

`response_for` writes a whole response from the request's fields; `Tally` sums the usage
of every score call that answered it.
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


class Tally:
    """The usage of every score call of one request (each a ScoreResult: its
    prompt_tokens, cached_tokens and prompt_cached_tokens)."""

    def __init__(self) -> None:
        self.prompt_cached = 0
        self.computed = 0

    def add(self, result, first: bool) -> None:
        """first: the prompt's first score call, whose cache hits are the prompt's own."""
        if first:
            self.prompt_cached += result.prompt_cached_tokens
        self.computed += result.prompt_tokens - result.cached_tokens


def response_for(
    chat: bool,
    fields: dict,
    answers: Sequence[Answer],
    decode: Decode,
    prompt_tokens: int,
    tally: Tally,
) -> dict:
    """The response to a choice request, its answers in order (n per prompt), logprobs as
    its fields ask (chat: `logprobs` true and `top_logprobs`; completions: `logprobs`, the
    count of top entries)."""
    choices = []
    for index, one in enumerate(answers):
        if chat:
            logprobs = (
                chat_logprobs(one.steps, fields.get("top_logprobs") or 0, decode)
                if fields.get("logprobs")
                else None
            )
            choices.append(chat_choice(index, one, logprobs))
        else:
            logprobs = (
                completion_logprobs(one.steps, fields["logprobs"], decode)
                if fields.get("logprobs") is not None
                else None
            )
            choices.append(completion_choice(index, one, logprobs))
    cached = min(tally.prompt_cached, prompt_tokens)
    return response(
        chat, fields.get("model"), choices, usage(prompt_tokens, answers, cached, tally.computed)
    )
