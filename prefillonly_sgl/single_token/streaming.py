"""A whole answer sent as a stream (plain Python): a streamed single-token request runs
unstreamed, there being one token, and a streamed choice request is answered whole; either
goes back to the client as Server-Sent Events in OpenAI's chunk shapes."""

from __future__ import annotations

import time

import orjson

from prefillonly_sgl.single_token.requests import CHAT_PATH


def choice_chunk_events(path: str, answer: dict, include_usage: bool) -> list[str]:
    """The SSE events of a whole single-token answer: one chunk per choice, in order (as
    SGLang streams them: a client tracks choices by the chunk's choices[0].index), the
    usage chunk when asked for, [DONE]."""
    chat = path == CHAT_PATH
    base = {
        "id": answer.get("id"),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": answer.get("created", int(time.time())),
        "model": answer.get("model"),
    }
    events = []
    for choice in answer.get("choices", []):
        one = {"index": choice.get("index", 0)}
        if chat:
            message = choice.get("message") or {}
            one["delta"] = {"role": "assistant", "content": message.get("content") or ""}
        else:
            one["text"] = choice.get("text", "")
        one["logprobs"] = choice.get("logprobs")
        one["finish_reason"] = choice.get("finish_reason")
        if "choice_probabilities" in choice:  # a choice request's (choices/rendering.py)
            one["choice_probabilities"] = choice["choice_probabilities"]
        events.append({**base, "choices": [one]})
    if include_usage and answer.get("usage") is not None:
        events.append({**base, "choices": [], "usage": answer["usage"]})
    return [f"data: {orjson.dumps(e).decode()}\n\n" for e in events] + ["data: [DONE]\n\n"]
