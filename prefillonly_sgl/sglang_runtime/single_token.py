"""Our /v1/chat/completions and /v1/completions on SGLang's server (the main process): the
translation between SGLang's OpenAI request models, handlers and outputs and the plain
decisions of prefillonly_sgl/single_token/ and prefillonly_sgl/choices/.

What runs where, by request:
- a request with an output constraint: choice_requests.py (choices/routing.py decides):
  a choice request is answered by scoring and never reaches SGLang's handler past its
  checks and conversion; a constraint outside the choice shape runs on SGLang's grammar
  path, vLLM's fields translated to SGLang's; a malformed one is refused;
- every other request goes to SGLang's own handler (its checks, template, conversion,
  sampler and response shapes), with what this module adds:
  - our request models (ChatRequest, CompletionsRequest): SGLang's with vLLM's fields
    and ours (single_token/request_fields.py, choices/routing.VLLMConstraints; SGLang's
    models would drop them) and their parse-time checks;
  - an AFTER hook on each handler's `_convert_to_internal_request` (it runs in an
    executor thread, so it reads the request object, never a context variable): a
    single-token request (single_token/requests.py) gets its reusable prefix's token ids
    in `custom_params` (single_token/prefix.py; features/prefill_kv/tokenizer_process.py
    turns them into R, which makes the scheduler run it as a prefill-only request) and
    `token_ids_logprob` for `logprob_token_ids` and `allowed_token_ids`; a loglikelihood
    request (echo, max_tokens 0 or 1) is marked to keep its whole prompt
    (docs/loglikelihood.md); a request generating more tokens with `allowed_token_ids`
    gets every other token biased out of SGLang's sampler (allowed_tokens.mask_bias);
  - a BEFORE hook on each handler's response builder: a single-token request with
    `allowed_token_ids` has its token picked among the allowed ones after the forward
    (allowed_tokens.restricted_answer, as vLLM's sampler would pick it; SGLang's sampler
    picked among all tokens), the rows of `logprob_token_ids` replace the natural top-k,
    and with `return_tokens_as_token_ids` every logprob's token is "token_id:<id>"
    (single_token/logprobs.py); an AFTER hook gives each completion token its real text
    offset (SGLang writes -1, "unknown");
  - a streamed single-token request runs unstreamed (there is one token) and is answered
    with one chunk per choice (single_token/streaming.py), as is a streamed choice
    request.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import PrivateAttr, field_validator, model_validator
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

from prefillonly_sgl.choices.routing import VLLMConstraints
from prefillonly_sgl.scoring.reusable_prefix import with_prefix_ids, with_whole_prompt
from prefillonly_sgl.sglang_runtime.choice_requests import route_choice_request
from prefillonly_sgl.single_token.allowed_tokens import (
    logprob_ids,
    mask_bias,
    resolved_sampling,
    restricted_answer,
)
from prefillonly_sgl.single_token.logprobs import text_offsets, tokens_as_ids, top_rows
from prefillonly_sgl.single_token.prefix import (
    chat_prefix_ids,
    completion_prefix,
    prefix_token_ids,
)
from prefillonly_sgl.single_token.request_fields import (
    CompletionsFields,
    SingleTokenFields,
    check_max_tokens,
    check_response_format_object,
    check_zero_tokens_need_echo,
)
from prefillonly_sgl.single_token.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    is_loglikelihood,
    is_single_token,
)
from prefillonly_sgl.single_token.streaming import choice_chunk_events

HOOK_TABLE_NAME = "single_token"
_CHAT_SERVING = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
_COMPLETION_SERVING = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"


class ChatRequest(SingleTokenFields, ChatCompletionRequest, VLLMConstraints):
    """SGLang's chat request with vLLM's `logprob_token_ids`, `allowed_token_ids`,
    `return_tokens_as_token_ids` and output constraints (`structured_outputs`, the legacy
    `guided_*`)."""

    # the resolved sampling parameters of a restricted single-token request (convert hook)
    _restricted: dict | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _response_format_is_an_object(cls, values):
        """Runs before SGLang's own set_json_schema (request_fields.py)."""
        check_response_format_object(values)
        return values


class CompletionsRequest(CompletionsFields, CompletionRequest, VLLMConstraints):
    """SGLang's completions request with `logprob_token_ids`, `allowed_token_ids`,
    `shared_prefix`, `max_tokens: 0` with `echo`, and vLLM's `return_tokens_as_token_ids`
    and output constraints (as ChatRequest; request_fields.py)."""

    _restricted: dict | None = PrivateAttr(default=None)

    @field_validator("max_tokens")
    @classmethod
    def validate_max_tokens_positive(cls, v):  # replaces SGLang's (> 0) of the same name
        return check_max_tokens(v)

    @model_validator(mode="after")
    def _zero_tokens_need_echo(self):
        check_zero_tokens_need_echo(self.max_tokens, self.echo)
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
    ids = logprob_ids(request.logprob_token_ids, request.allowed_token_ids)
    if request.allowed_token_ids:
        # Every allowed token's logprob at the position: the answer is chosen among them
        # after the forward (_before_build_response), as vLLM's sampler would pick it.
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
    allowed token the sampler picks (allowed_tokens.restricted_answer) where SGLang's
    unrestricted one is not it; the position's other logprobs stay as they are."""
    meta = item["meta_info"]
    tm = self.tokenizer_manager

    def decode(token: int, skip_special: bool) -> str:
        return tm.tokenizer.decode([token], skip_special_tokens=skip_special)

    replaced = restricted_answer(
        (meta.get("output_token_ids_logprobs") or [None])[0] or [],
        request.allowed_token_ids,
        sampling,
        index,
        (meta.get("output_token_logprobs") or [None])[0],
        set(getattr(tm.model_config, "hf_eos_token_id", None) or set()),
        decode,
    )
    if replaced is None:
        return
    item["text"] = replaced.text
    item["output_ids"] = [replaced.row[1]]
    meta["finish_reason"] = replaced.finish
    meta["output_token_logprobs"] = [replaced.row]


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
