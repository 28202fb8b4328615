"""Choice requests on SGLang's server (the main process): /v1/chat/completions and
/v1/completions requests whose output is one of a fixed set of strings, answered by
scoring (decisions in prefillonly_sgl/choices/).

    route (single_token.py) ─> route_choice_request
        no constraint, or outside the choice shape ─> SGLang's handler (vLLM's fields
                                                       translated to SGLang's)
        a choice request ─> SGLang's own checks and conversion (template, LoRA, salt)
                         ─> per prompt and answer: choices/answering.answer, each slot
                            scored by ScoringFront.label_token_logprobs behind the
                            prompt's reusable prefix
                         ─> choices/rendering.py (OpenAI's shapes)

The prompt is SGLang's own rendering (its chat template, tools, chat_template_kwargs, its
tokenization of a completions prompt), so a choice request runs on the prompt a
generating request would; its reusable prefix is the single-token path's (the chat
history before the last message, or completions' shared_prefix), so the JCT scheduler
groups requests sharing a system prompt, and the first computes it for the others.
"""

from __future__ import annotations

import asyncio
import dataclasses

from pydantic import BaseModel

from prefillonly_sgl.choices.answering import Answer, answer, longest_answer_tokens
from prefillonly_sgl.choices.constraints import Constraint, find_constraint, scorable
from prefillonly_sgl.choices.rendering import (
    chat_choice,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    response,
    usage,
)
from prefillonly_sgl.scoring.call_context import current
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.labels import compile_labels, label_set
from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len
from prefillonly_sgl.single_token.allowed_tokens import resolved_sampling
from prefillonly_sgl.single_token.prefix import (
    chat_prefix_ids,
    completion_prefix,
    prefix_token_ids,
)
from prefillonly_sgl.single_token.requests import CHAT_PATH


class VLLMConstraints(BaseModel):
    """vLLM's output constraints, which our chat and completions request models take
    (single_token.py; SGLang's would drop them and the request would run unconstrained)."""

    structured_outputs: dict | None = None
    guided_choice: list | None = None
    guided_regex: str | None = None
    guided_json: dict | str | None = None
    guided_grammar: str | None = None


VLLM_FIELDS = tuple(VLLMConstraints.model_fields)
_PROMPT_TAIL_TOKENS = 16  # what the first choice is tokenized after (labels.TAIL_CHARS)


@dataclasses.dataclass
class Routed:
    """What the route does with a request: answer it (``answer``: a dict, or SGLang's
    error response) or run it on SGLang's path as ``request``."""

    request: object
    answer: object = None


async def route_choice_request(serving, path: str, request, raw_request, front) -> Routed:
    """A chat or completions request answered here (a choice request, or a refusal of
    its constraint), or handed on to SGLang's handler (see the module docstring)."""
    from fastapi import HTTPException

    chat = path == CHAT_PATH
    fields = _fields(request)
    try:
        constraint = find_constraint(fields, chat)
    except InvalidRequestError as e:
        return Routed(request, serving.create_error_response(str(e)))
    if constraint is None:
        return Routed(request)
    if not scorable(constraint, fields) or front.head is not None:
        return Routed(_on_sglang_path(request, constraint))
    try:
        answered = await _answer(serving, chat, request, raw_request, front, constraint)
    except (InvalidRequestError, ValueError) as e:  # as SGLang's handle_request answers them
        return Routed(request, serving.create_error_response(str(e)))
    except HTTPException as e:
        error = serving.create_error_response(e.detail, str(e.status_code), e.status_code)
        return Routed(request, error)
    if answered is None:  # a short max_tokens (SGLang truncates) or a multimodal prompt
        return Routed(_on_sglang_path(request, constraint))
    return Routed(request, answered)


def _fields(request) -> dict:
    fields = dict(request.__dict__)  # chat's max_tokens is deprecated: no attribute access
    response_format = fields.get("response_format")
    if hasattr(response_format, "model_dump"):
        fields["response_format"] = response_format.model_dump(by_alias=True)
    return fields


def _on_sglang_path(request, constraint: Constraint):
    """The request with vLLM's constraint as SGLang's fields (SGLang's own: unchanged)."""
    from sglang.srt.entrypoints.openai.protocol import ResponseFormat

    update = {name: None for name in VLLM_FIELDS if getattr(request, name, None) is not None}
    for name, value in constraint.sglang_fields.items():
        update[name] = ResponseFormat.model_validate(value) if name == "response_format" else value
    return request.model_copy(update=update) if update else request


async def _answer(serving, chat: bool, request, raw_request, front, constraint) -> dict | None:
    """The response to a choice request (None: it runs on SGLang's path after all: its
    max_tokens cannot hold an answer, or its prompt carries images, video or audio)."""
    error = serving._validate_request(request)  # SGLang's own checks, as its handler runs
    if error:
        raise InvalidRequestError(error)
    loop = asyncio.get_running_loop()
    adapted, _ = await loop.run_in_executor(
        None, serving._convert_to_internal_request, request, raw_request
    )
    if any(getattr(adapted, f, None) for f in ("image_data", "video_data", "audio_data")):
        return None  # a multimodal prompt: its media go with SGLang's own request only
    tokenizer = front.tokenizer

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    shape = constraint.shape
    limit = _max_tokens(request, chat)
    if limit is not None and limit < longest_answer_tokens(shape, encode):
        return None
    prompts = _prompt_ids(adapted, tokenizer)
    prefix = _prefix_ids(chat, request, tokenizer)
    sampling = resolved_sampling(adapted.sampling_params)
    # the call's context: the request's (the guard's: tenant, record), with this body's
    # own salt and adapter where it names them, and the HTTP request (scoring/call_context.py)
    salt = adapted.cache_salt if isinstance(adapted.cache_salt, str) else None
    adapter = adapted.lora_path if isinstance(adapted.lora_path, str) else None
    ctx = current().entering(salt=salt, adapter=adapter).replace(http_request=raw_request)
    tally = _Tally()

    def choice_tokens(texts, before: str) -> list[tuple[int, ...]]:
        ids = compile_labels(label_set(list(texts)), tokenizer, before, leading_space=False)
        return [tuple(i) if isinstance(i, tuple) else (i,) for i in ids]

    async def one_prompt(prompt: list[int]) -> list[Answer]:
        shared = common_prefix_len(prefix, prompt) if prefix else 0
        shared = min(shared, len(prompt) - 1)  # the item is never empty
        memo: dict = {}

        async def score(written: list[int], labels) -> list[list[float]]:
            key = (tuple(written), tuple(labels))
            if key not in memo:  # n answers sampled from the same scores
                result = await front.label_token_logprobs(
                    ctx, prompt[:shared], [prompt[shared:] + written], [list(x) for x in labels]
                )
                tally.add(result, first=not memo)  # the prompt's own hits: its first call
                memo[key] = result.rows[0]
            return memo[key]

        tail = tokenizer.decode(prompt[-_PROMPT_TAIL_TOKENS:])
        answers = []
        for j in range(request.n or 1):
            answers.append(
                await answer(
                    shape,
                    tail,
                    score,
                    choice_tokens,
                    encode,
                    tokenizer.eos_token_id,
                    sampling,
                    draw=str(j),
                )  # fmt: skip
            )
        return answers

    per_prompt = await asyncio.gather(*(one_prompt(p) for p in prompts))
    answers = [a for group in per_prompt for a in group]
    return _response(chat, request, answers, tokenizer, sum(len(p) for p in prompts), tally)


def _max_tokens(request, chat: bool) -> int | None:
    """The answer's token limit the client gave (None: none given; completions' default
    of 16 is not a limit the client asked for)."""
    data = request.__dict__
    if chat:
        value = data.get("max_completion_tokens")
        return data.get("max_tokens") if value is None else value
    return data.get("max_tokens") if "max_tokens" in request.model_fields_set else None


def _prompt_ids(adapted, tokenizer) -> list[list[int]]:
    """Each prompt's token ids as SGLang would run it (text tokenized as its tokenizer
    manager tokenizes it)."""
    if adapted.input_ids is not None:
        ids = adapted.input_ids
        return [list(p) for p in ids] if ids and isinstance(ids[0], list) else [list(ids)]
    texts = adapted.text if isinstance(adapted.text, list) else [adapted.text]
    return [list(tokenizer.encode(t)) for t in texts]


def _prefix_ids(chat: bool, request, tokenizer) -> list[int]:
    if chat:
        return chat_prefix_ids(tokenizer, request)
    prefix = completion_prefix(request.prompt, request.shared_prefix)
    return prefix_token_ids(prefix, tokenizer.encode)


class _Tally:
    """The usage of every score call of one request."""

    def __init__(self) -> None:
        self.prompt_cached = 0
        self.computed = 0

    def add(self, result, first: bool) -> None:
        if first:
            self.prompt_cached += result.prompt_cached_tokens
        self.computed += result.prompt_tokens - result.cached_tokens


def _response(chat, request, answers, tokenizer, prompt_tokens, tally) -> dict:
    def decode(token: int) -> str:
        return tokenizer.decode([token])

    choices = []
    for index, one in enumerate(answers):
        if chat:
            logprobs = (
                chat_logprobs(one.steps, request.top_logprobs or 0, decode)
                if request.logprobs
                else None
            )
            choices.append(chat_choice(index, one, logprobs))
        else:
            logprobs = (
                completion_logprobs(one.steps, request.logprobs, decode)
                if request.logprobs is not None
                else None
            )
            choices.append(completion_choice(index, one, logprobs))
    cached = min(tally.prompt_cached, prompt_tokens)
    return response(
        chat, request.model, choices, usage(prompt_tokens, answers, cached, tally.computed)
    )
