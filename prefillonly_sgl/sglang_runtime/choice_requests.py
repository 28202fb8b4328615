"""Choice requests on SGLang's server (the main process): the translation between SGLang's
request objects and calls and the plain decisions of prefillonly_sgl/choices/ (which way a
request goes: routing.py; its answer: answering.py; its response: rendering.py).

    route (single_token.py) ─> route_choice_request: routing.route on the request's fields
        no constraint ─> SGLang's handler, the request unchanged
        refused ─> SGLang's error response, naming the problem
        SGLang's path ─> the request with routing.sglang_path_update's fields (vLLM's
                         constraint in SGLang's fields: ResponseFormat built here)
        scored ─> SGLang's own checks and conversion (template, LoRA, salt)
               ─> per prompt and answer: choices/answering.answer, each slot scored by
                  ScoringFront.label_token_logprobs behind the prompt's reusable prefix
               ─> choices/rendering.response_for (OpenAI's shapes)

The prompt is SGLang's own rendering (its chat template, tools, chat_template_kwargs, its
tokenization of a completions prompt), so a choice request runs on the prompt a
generating request would; its reusable prefix is the single-token path's (the chat
history before the last message, or completions' shared_prefix), so the JCT scheduler
groups requests sharing a system prompt, and the first computes it for the others.

A chat with `image_url` parts on a vision-language model is scored the same way, as
text: the prompt SGLang rendered (the template's image placeholders in it, split at the
reusable prefix's end), its images loaded here (scoring/images.py: a bad one is a 400
naming its message part) and sent with every score call; the answer's tokens follow as
text (scoring/appended_tokens.py), and where they would not tokenize back exactly the
request runs on SGLang's path after all.
"""

from __future__ import annotations

import asyncio
import dataclasses

from prefillonly_sgl.choices.answering import PROMPT_TAIL_TOKENS, Answer, answer, query_len
from prefillonly_sgl.choices.constraints import Constraint
from prefillonly_sgl.choices.rendering import Tally, response_for
from prefillonly_sgl.choices.routing import (
    REFUSED,
    SGLANG_PATH,
    UNCONSTRAINED,
    answer_token_limit,
    falls_through_after_conversion,
    route,
    sglang_path_update,
)
from prefillonly_sgl.scoring.appended_tokens import NotExactAsText, appended_text
from prefillonly_sgl.scoring.call_context import current
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.images import load_image
from prefillonly_sgl.scoring.labels import compile_labels, label_set
from prefillonly_sgl.single_token.allowed_tokens import resolved_sampling
from prefillonly_sgl.single_token.prefix import (
    chat_prefix_ids,
    completion_prefix,
    prefix_token_ids,
)
from prefillonly_sgl.single_token.requests import CHAT_PATH
from prefillonly_sgl.wire.chat_images import chat_images

MEDIA = (("image", "image_data"), ("video", "video_data"), ("audio", "audio_data"))


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
    way = route(fields, chat, head=front.head is not None)
    if way.way == REFUSED:
        return Routed(request, serving.create_error_response(way.error))
    if way.way == UNCONSTRAINED:
        return Routed(request)
    if way.way == SGLANG_PATH:
        return Routed(_on_sglang_path(request, fields, way.constraint))
    try:
        answered = await _answer(serving, chat, request, raw_request, front, way.constraint)
    except (InvalidRequestError, ValueError) as e:  # as SGLang's handle_request answers them
        return Routed(request, serving.create_error_response(str(e)))
    except HTTPException as e:
        error = serving.create_error_response(e.detail, str(e.status_code), e.status_code)
        return Routed(request, error)
    if answered is None:  # a short max_tokens (SGLang truncates) or a multimodal prompt
        return Routed(_on_sglang_path(request, fields, way.constraint))
    return Routed(request, answered)


def _fields(request) -> dict:
    fields = dict(request.__dict__)  # chat's max_tokens is deprecated: no attribute access
    response_format = fields.get("response_format")
    if hasattr(response_format, "model_dump"):
        fields["response_format"] = response_format.model_dump(by_alias=True)
    return fields


def _on_sglang_path(request, fields: dict, constraint: Constraint):
    """The request with vLLM's constraint as SGLang's fields (SGLang's own: unchanged)."""
    from sglang.srt.entrypoints.openai.protocol import ResponseFormat

    update = sglang_path_update(fields, constraint)
    if update.get("response_format") is not None:
        update["response_format"] = ResponseFormat.model_validate(update["response_format"])
    return request.model_copy(update=update) if update else request


async def _answer(serving, chat: bool, request, raw_request, front, constraint) -> dict | None:
    """The response to a choice request (None: it runs on SGLang's path after all:
    routing.falls_through_after_conversion)."""
    error = serving._validate_request(request)  # SGLang's own checks, as its handler runs
    if error:
        raise InvalidRequestError(error)
    loop = asyncio.get_running_loop()
    adapted, _ = await loop.run_in_executor(
        None, serving._convert_to_internal_request, request, raw_request
    )
    tokenizer = front.tokenizer

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    shape = constraint.shape
    media = [kind for kind, field in MEDIA if getattr(adapted, field, None)]
    facts = front.facts
    scores_images = facts.image_placeholder is not None and facts.image_refusal is None
    limit = answer_token_limit(
        request.__dict__, chat, "max_tokens" in request.model_fields_set
    )  # fmt: skip
    prompts = _prompt_ids(adapted, tokenizer)
    if falls_through_after_conversion(media, scores_images, len(prompts), limit, shape, encode):
        return None
    # a prompt with images: text, its images loaded here (a bad one is a 400 naming it)
    images = None
    if "image" in media:  # fetching a URL blocks: off the event loop
        images = await loop.run_in_executor(None, _loaded_images, adapted, request)
    prefix = _prefix_ids(chat, request, tokenizer)
    sampling = resolved_sampling(adapted.sampling_params)
    # the call's context: the request's (the guard's: tenant, record), with this body's
    # own salt and adapter where it names them, and the HTTP request (scoring/call_context.py)
    salt = adapted.cache_salt if isinstance(adapted.cache_salt, str) else None
    adapter = adapted.lora_path if isinstance(adapted.lora_path, str) else None
    ctx = current().entering(salt=salt, adapter=adapter).replace(http_request=raw_request)
    tally = Tally()

    def choice_tokens(texts, before: str) -> list[tuple[int, ...]]:
        ids = compile_labels(label_set(list(texts)), tokenizer, before, leading_space=False)
        return [tuple(i) if isinstance(i, tuple) else (i,) for i in ids]

    own_tokens: list[int] = []  # with images: each prompt's tokens, images expanded

    async def one_prompt(prompt: list[int]) -> list[Answer]:
        shared = query_len(prefix, prompt)
        memo: dict = {}
        text = adapted.text if images is not None else ""  # with images: the prompt's text,
        head = tokenizer.decode(prompt[:shared]) if text else ""  # its query the prefix's
        head = head if text.startswith(head) else ""  # (else no query: nothing reusable)

        async def score(written: list[int], labels) -> list[list[float]]:
            key = (tuple(written), tuple(labels))
            if key in memo:  # n answers sampled from the same scores
                return memo[key]
            labels = [list(x) for x in labels]
            if images is None:
                query, item, image_data = prompt[:shared], prompt[shared:] + written, None
            else:
                # as SGLang tokenizes the text (special tokens included, as _prompt_ids)
                after = appended_text(text, prompt, written, tokenizer.encode, tokenizer.decode)
                query, item, image_data = head, text[len(head) :] + after, [images]
            result = await front.label_token_logprobs(ctx, query, [item], labels, image_data)
            if not memo:  # the prompt's own: its first call
                own_tokens.append(result.prompt_own_tokens - len(written))
            tally.add(result, first=not memo)
            memo[key] = result.rows[0]
            return memo[key]

        tail = tokenizer.decode(prompt[-PROMPT_TAIL_TOKENS:])
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

    try:
        per_prompt = await asyncio.gather(*(one_prompt(p) for p in prompts))
    except NotExactAsText:  # the answer's tokens would not survive as text after the prompt
        return None
    answers = [a for group in per_prompt for a in group]

    def decode(token: int) -> str:
        return tokenizer.decode([token])

    prompt_tokens = sum(own_tokens) if images is not None else sum(len(p) for p in prompts)
    return response_for(chat, request.__dict__, answers, decode, prompt_tokens, tally)


def _loaded_images(adapted, request) -> list[bytes]:
    """The prompt's images (SGLang's, in its placeholders' order) as checked bytes, each
    error naming the message part it came from."""
    given = [getattr(d, "url", d) for d in adapted.image_data]
    messages = [m.model_dump() if hasattr(m, "model_dump") else m for m in request.messages]
    _, parts = chat_images(messages)
    names = [p.where for p in parts] if len(parts) == len(given) else []
    names += [f"image {k}" for k in range(len(names), len(given))]
    return [load_image(url, name) for url, name in zip(given, names, strict=True)]


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
