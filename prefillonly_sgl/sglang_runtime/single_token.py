"""Single-token OpenAI requests on SGLang's server (the main process).

SGLang's own OpenAI handlers build, sample and render these requests (its sampler picks
the token from the prefill's last-position logits with the request's temperature, top_p,
top_k, min_p, seed and logit_bias; `n`, `stop` and the response shapes are SGLang's); what
this module adds (decisions in prefillonly_sgl/single_token/):

- routes for /v1/chat/completions and /v1/completions taking our extension fields
  (`logprob_token_ids`, completions' `shared_prefix`; SGLang's request models would drop
  them) and answering a streamed single-token request with one chunk per choice (then
  the usage chunk when asked for, then [DONE]): the request runs unstreamed, there being
  one token;
- an AFTER hook on each handler's `_convert_to_internal_request` (it runs in an executor
  thread, so it reads the request object, never a context variable): a single-token
  request gets its reusable prefix's token ids in `custom_params` (single_token/prefix.py;
  features/prefill_kv/tokenizer_process.py turns them into R, which makes the scheduler
  run the request as a prefill-only request) and `token_ids_logprob` for
  `logprob_token_ids`; a loglikelihood request (echo, max_tokens 0 or 1) is marked to
  keep its whole prompt (docs/loglikelihood.md);
- a BEFORE hook on each handler's response builder: the rows of `logprob_token_ids`
  replace the natural top-k, and with vLLM's `return_tokens_as_token_ids` every logprob's
  token is "token_id:<id>" (single_token/logprobs.py; an unstreamed answer, or a streamed
  single-token one, which runs unstreamed), and an AFTER hook gives each
  completion token its real text offset (SGLang writes -1, "unknown").
"""

from __future__ import annotations

import time

import orjson
from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import PrivateAttr, field_validator, model_validator
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

from prefillonly_sgl.scoring.reusable_prefix import with_prefix_ids, with_whole_prompt
from prefillonly_sgl.sglang_runtime.choice_requests import VLLMConstraints, route_choice_request
from prefillonly_sgl.single_token.allowed_tokens import (
    finish_of,
    mask_bias,
    resolved_sampling,
    restricted_choice,
)
from prefillonly_sgl.single_token.logprobs import text_offsets, tokens_as_ids, top_rows
from prefillonly_sgl.single_token.prefix import (
    chat_prefix_ids,
    completion_prefix,
    prefix_token_ids,
)
from prefillonly_sgl.single_token.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    is_loglikelihood,
    is_single_token,
)

HOOK_TABLE_NAME = "single_token"
_CHAT_SERVING = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
_COMPLETION_SERVING = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"


class ChatRequest(ChatCompletionRequest, VLLMConstraints):
    """SGLang's chat request with vLLM's `logprob_token_ids`, `allowed_token_ids`,
    `return_tokens_as_token_ids` and output constraints (`structured_outputs`, the legacy
    `guided_*`)."""

    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None
    # the resolved sampling parameters of a restricted single-token request (convert hook)
    _restricted: dict | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _response_format_is_an_object(cls, values):
        """Runs before SGLang's own set_json_schema, which calls .get on response_format
        and its schema and so answered a string there with a 500."""
        if isinstance(values, dict):
            response_format = values.get("response_format")
            if response_format and not isinstance(response_format, dict):
                raise ValueError("response_format must be an object")
            schema = response_format.get("schema") if response_format else None
            if schema and not isinstance(schema, dict):
                raise ValueError("response_format.schema must be an object")
        return values


class CompletionsRequest(CompletionRequest, VLLMConstraints):
    """SGLang's completions request with `logprob_token_ids`, `allowed_token_ids` and
    `shared_prefix`, and
    `max_tokens: 0` with `echo` (the prompt's own logprobs only, as OpenAI's API allows
    and older lm-evaluation-harness versions send; SGLang refuses 0), and vLLM's
    `return_tokens_as_token_ids` and output constraints (as ChatRequest)."""

    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None
    shared_prefix: str | list[int] | None = None
    _restricted: dict | None = PrivateAttr(default=None)

    @field_validator("max_tokens")
    @classmethod
    def validate_max_tokens_positive(cls, v):  # replaces SGLang's (> 0) of the same name
        if v is not None and v < 0:
            raise ValueError("max_tokens must be 0 or more")
        return v

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError(
                "max_tokens: 0 generates nothing: give echo: true (and logprobs) for the "
                "prompt's own logprobs, or max_tokens >= 1"
            )
        return self


def _fields(request) -> dict:
    # __dict__: chat's max_tokens is a deprecated pydantic field (attribute access warns).
    return request.__dict__


def _single_token(path: str, request) -> bool:
    return is_single_token(path, _fields(request))


def _loglikelihood(request) -> bool:
    return is_loglikelihood(COMPLETIONS_PATH, _fields(request))


# -- marking: prefix and label ids (executor thread) --------------------------------------
_MARK_PREFIXES = {"on": True}  # serve turns it off when no feature reads R


def _mark(adapted, request, prefix_ids: list[int]) -> None:
    ids = list(request.logprob_token_ids or [])
    if request.allowed_token_ids:
        # Every allowed token's logprob at the position: the answer is chosen among them
        # after the forward (_before_build_response), as vLLM's sampler would pick it.
        ids += [t for t in request.allowed_token_ids if t not in ids]
        adapted.return_logprob = True
        request._restricted = resolved_sampling(adapted.sampling_params)
    if ids:
        adapted.token_ids_logprob = ids
    _mark_custom_params(adapted, lambda custom: with_prefix_ids(custom, prefix_ids))


def _mask_generation(self, adapted, request) -> None:
    """A request generating more than one token: SGLang's sampler restricted at every step
    (every other token biased out; allowed_tokens.mask_bias)."""
    vocab_size = self.tokenizer_manager.model_config.vocab_size
    params = adapted.sampling_params
    for one in params if isinstance(params, list) else [params]:
        one["logit_bias"] = mask_bias(request.allowed_token_ids, vocab_size, one.get("logit_bias"))


def _mark_custom_params(adapted, mark) -> None:
    """Each prompt's custom_params becomes mark(custom_params), when a runtime feature
    reads the reusable prefix."""
    if not _MARK_PREFIXES["on"]:
        return
    params = adapted.sampling_params
    for one in params if isinstance(params, list) else [params]:
        one["custom_params"] = mark(one.get("custom_params"))


def _after_chat_convert(result, self, request, *args, **kwargs):
    adapted, _ = result
    if isinstance(request, ChatRequest) and _single_token(CHAT_PATH, request):
        _mark(adapted, request, chat_prefix_ids(self.tokenizer_manager.tokenizer, request))
    elif isinstance(request, ChatRequest) and request.allowed_token_ids:
        _mask_generation(self, adapted, request)
    return result


def _after_completion_convert(result, self, request, *args, **kwargs):
    adapted, _ = result
    if isinstance(request, CompletionsRequest) and _loglikelihood(request):
        _mark_custom_params(adapted, with_whole_prompt)
        return result
    if isinstance(request, CompletionsRequest) and _single_token(COMPLETIONS_PATH, request):
        prefix = completion_prefix(request.prompt, request.shared_prefix)
        tokenizer = self.tokenizer_manager.tokenizer
        _mark(adapted, request, prefix_token_ids(prefix, tokenizer.encode))
    elif isinstance(request, CompletionsRequest) and request.allowed_token_ids:
        _mask_generation(self, adapted, request)
    return result


# -- rendering ----------------------------------------------------------------------------
def _before_build_response(self, request, ret, *args, **kwargs):
    """allowed_token_ids (single-token): each choice's token picked among the allowed
    ones; logprob_token_ids: their rows (and the sampled token's) become the positions'
    top logprobs; return_tokens_as_token_ids: every logprob's token is "token_id:<id>"."""
    restricted = getattr(request, "_restricted", None)
    if restricted is not None:
        for index, item in enumerate(ret):
            _answer_among_allowed(self, request, item, restricted, index)
    requested = getattr(request, "logprob_token_ids", None)
    as_ids = getattr(request, "return_tokens_as_token_ids", None)
    for item in ret if (requested or as_ids) else ():
        meta = item["meta_info"]
        if requested:
            meta["output_top_logprobs"] = top_rows(
                meta.get("output_token_ids_logprobs") or [],
                requested,
                meta.get("output_token_logprobs"),
            )
        if as_ids:
            tokens_as_ids(meta)
    return None


def _answer_among_allowed(self, request, item: dict, sampling: dict, index: int) -> None:
    """One choice's answer (its token, text, finish reason and logprob) replaced by the
    allowed token the sampler picks (allowed_tokens.restricted_choice) where SGLang's
    unrestricted one is not it; the position's other logprobs stay as they are."""
    meta = item["meta_info"]
    rows = (meta.get("output_token_ids_logprobs") or [None])[0] or []
    allowed = set(request.allowed_token_ids)
    chosen = restricted_choice([r for r in rows if r[1] in allowed], sampling, index)
    sampled = (meta.get("output_token_logprobs") or [None])[0]
    if sampled is not None and sampled[1] == chosen[1]:
        return
    tm = self.tokenizer_manager
    eos = getattr(tm.model_config, "hf_eos_token_id", None) or set()
    finish = finish_of(
        chosen[1], set(sampling.get("stop_token_ids") or ()), bool(sampling.get("ignore_eos")),
        set(eos),
    )  # fmt: skip
    skip_special = sampling.get("skip_special_tokens")
    text = tm.tokenizer.decode([chosen[1]], skip_special_tokens=skip_special is not False)
    item["text"] = "" if finish["type"] == "stop" else text
    item["output_ids"] = [chosen[1]]
    meta["finish_reason"] = finish
    meta["output_token_logprobs"] = [tuple(chosen)]


def _after_build_completion_response(response, self, request, *args, **kwargs):
    """Real text offsets (SGLang writes -1, "unknown"): each token's character offset in
    the choice's text, which starts with the echoed prompt (or, without echo, with the
    generated token)."""
    if isinstance(request, CompletionsRequest):
        for choice in response.choices:
            logprobs = choice.logprobs
            if logprobs is not None and logprobs.tokens and -1 in logprobs.text_offset:
                logprobs.text_offset = text_offsets(logprobs.tokens)
    return response


HOOKS = {
    f"{_CHAT_SERVING}._convert_to_internal_request": ("AFTER", _after_chat_convert),
    f"{_COMPLETION_SERVING}._convert_to_internal_request": (
        "AFTER",
        _after_completion_convert,
    ),
    f"{_CHAT_SERVING}._build_chat_response": ("BEFORE", _before_build_response),
    f"{_COMPLETION_SERVING}._build_completion_response": ("BEFORE", _before_build_response),
}
# A target takes one hook per type in our tables; the completion builder's second one:
AFTER_HOOKS = {
    f"{_COMPLETION_SERVING}._build_completion_response": (
        "AFTER",
        _after_build_completion_response,
    ),
}


def install_in_this_process(mark_prefixes: bool) -> None:
    """The serving hooks, applied now (serve calls it before SGLang starts)."""
    from prefillonly_sgl.hooking.hooks import apply_hooks_now, register_hooks

    _MARK_PREFIXES["on"] = mark_prefixes
    register_hooks(HOOK_TABLE_NAME, HOOKS)  # applied with the next table, at once
    apply_hooks_now(HOOK_TABLE_NAME + "_after", AFTER_HOOKS)


# -- routes -------------------------------------------------------------------------------
def install_routes(app, runtime) -> None:
    """Our /v1/chat/completions and /v1/completions in place of SGLang's (same handlers;
    choice requests answered by scoring on ``runtime``'s front: choice_requests.py)."""
    # Imported here: SGLang's server module builds its app at import.
    from sglang.srt.entrypoints.http_server import model_json_response, validate_json_request

    from prefillonly_sgl.server.auth import NORMAL
    from prefillonly_sgl.sglang_runtime.http_server.access import declare

    async def chat(request: ChatRequest, raw_request: Request):
        serving = raw_request.app.state.openai_serving_chat
        answer = await _handle(serving, CHAT_PATH, request, raw_request, runtime.front)
        return model_json_response(answer)

    async def completions(request: CompletionsRequest, raw_request: Request):
        serving = raw_request.app.state.openai_serving_completion
        answer = await _handle(serving, COMPLETIONS_PATH, request, raw_request, runtime.front)
        return model_json_response(answer)

    for path, endpoint in ((CHAT_PATH, chat), (COMPLETIONS_PATH, completions)):
        stock = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path]
        if len(stock) != 1:
            raise RuntimeError(f"expected one SGLang {path} route, found {len(stock)}")
        endpoint.__doc__ = stock[0].endpoint.__doc__
        app.router.routes.remove(stock[0])
        app.add_api_route(
            path,
            declare(endpoint, NORMAL),  # as SGLang's route it replaces
            methods=["POST"],
            dependencies=[Depends(validate_json_request)],
        )


async def _handle(serving, path: str, request, raw_request, front):
    routed = await route_choice_request(serving, path, request, raw_request, front)
    if routed.answer is not None:
        if not isinstance(routed.answer, dict):  # SGLang's error response
            return routed.answer
        if not request.stream:
            return routed.answer
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = choice_chunk_events(path, routed.answer, include_usage)
        return StreamingResponse(iter(events), media_type="text/event-stream")
    request = routed.request
    if not (request.stream and _single_token(path, request)):
        return await serving.handle_request(request, raw_request)
    # One token: run it unstreamed, answer with one chunk per choice (SSE).
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    whole = request.model_copy(update={"stream": False, "stream_options": None})
    response = await serving.handle_request(whole, raw_request)
    if not hasattr(response, "choices"):  # an error response: as SGLang sends it
        return response
    events = choice_chunk_events(path, response.model_dump(exclude_none=True), include_usage)
    return StreamingResponse(iter(events), media_type="text/event-stream")


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
        if "choice_probabilities" in choice:  # a choice request's (choice_requests.py)
            one["choice_probabilities"] = choice["choice_probabilities"]
        events.append({**base, "choices": [one]})
    if include_usage and answer.get("usage") is not None:
        events.append({**base, "choices": [], "usage": answer["usage"]})
    return [f"data: {orjson.dumps(e).decode()}\n\n" for e in events] + ["data: [DONE]\n\n"]
