"""POST /v1/classify (SGLang's / vLLM's schema), backed by a DSL classifier with one input
parameter (`serve --app FILE --classify NAME`):

    input     a text, a list of texts, token ids or lists of token ids (decoded to the
              text the classifier's prompt takes), or
    messages  a chat, rendered with the model's chat template into that text
              (add_generation_prompt, continue_final_message, chat_template_kwargs);
              on a vision-language model its `image_url` parts are images of the
              classifier's prompt, where the template put their placeholders
              (classify_images.py)
    -> {id, object: "list", created, model, data [{index, label, probs (label order),
        num_classes}], usage, function, labels}

vLLM's extras: truncate_prompt_tokens cuts each input to its first N tokens
(truncation_side "left": its last N; -1: as many as fit; more than fit is a 400 naming
the field), and an input too long for the prompt without it is a 400 naming it;
use_activation false answers the labels' log-probabilities (softmax of them gives the
probabilities). Errors are vLLM's `{"error": {message, type, param, code}}`, each message
naming the field (its body is parsed here: `raw_body`).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid

from prefillonly_sgl.apis.classify_images import (
    ChatImagesJob,
    chat_with_images,
    check_placeholders,
    split_images,
)
from prefillonly_sgl.apis.rerank import call_usage, model_name
from prefillonly_sgl.apis.truncation import JOIN_SLACK
from prefillonly_sgl.dsl.backends.server import server_backend
from prefillonly_sgl.dsl.job import ClassifyJob
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.images import load_image
from prefillonly_sgl.scoring.validation import check_text_or_ids
from prefillonly_sgl.server.endpoints import EndpointSpec
from prefillonly_sgl.server.error_bodies import parse_body
from prefillonly_sgl.wire.chat_images import chat_images
from prefillonly_sgl.wire.sglang import (
    ClassifyData,
    ClassifyRequest,
    ClassifyResponse,
    classify_parameter,
)
from prefillonly_sgl.wire.vllm import truncated, truncation_limit

ERROR_SHAPE = "vllm"  # vLLM's clients and tests read `error.message`


def request_inputs(
    request: ClassifyRequest, tokenizer, vocab_size: int, messages: list | None = None
) -> tuple[list, str]:
    """The request's inputs as texts, and the field they came from (for messages:
    ``messages``, the chat as the template reads it, else the request's)."""
    if request.messages is not None:
        return [render_chat(request, tokenizer, messages)], "messages"
    value = request.input
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError("input is empty: give a text or a non-empty list")
        return [value], "input"
    if not value:
        raise InvalidRequestError("input is empty: give a text or a non-empty list")
    if all(isinstance(v, str) for v in value):
        return list(value), "input"
    if all(isinstance(v, int) for v in value):
        return [decode_ids(value, "input", tokenizer, vocab_size)], "input"
    return [decode_ids(ids, f"input[{i}]", tokenizer, vocab_size)
            for i, ids in enumerate(value)], "input"  # fmt: skip


def decode_ids(ids: list[int], name: str, tokenizer, vocab_size: int) -> str:
    if not ids:
        raise InvalidRequestError(f"{name} is empty: give at least one token id")
    check_text_or_ids(ids, name, vocab_size)  # the vocabulary check every front shares
    return tokenizer.decode(ids)


def render_chat(request: ClassifyRequest, tokenizer, messages: list | None = None) -> str:
    if not request.messages:
        raise InvalidRequestError("messages is empty: give at least one message")
    try:
        return tokenizer.apply_chat_template(
            request.messages if messages is None else messages,
            tokenize=False,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            **(request.chat_template_kwargs or {}),
        )
    except Exception as e:  # a malformed chat or a template that refuses it
        raise InvalidRequestError(f"messages: the chat template cannot render them: {e}") from None


def fit_inputs(texts: list[str], field: str, room: int, request: ClassifyRequest, tokenizer):
    """Each input as the classifier will see it: cut to truncate_prompt_tokens when given,
    refused (naming it) when longer than ``room`` tokens otherwise."""
    limit = truncation_limit(request.truncate_prompt_tokens, room)
    fitted = []
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if limit is not None and len(ids) > limit:
            text = tokenizer.decode(truncated(ids, limit, request.truncation_side))
        elif limit is None and len(ids) > room:
            name = field if len(texts) == 1 and field == "messages" else f"{field}[{i}]"
            raise InvalidRequestError(
                f"{name} is {len(ids)} tokens; with the classifier's prompt at most {room} fit "
                "(shorten it, or cut it: truncate_prompt_tokens)"
            )
        fitted.append(text)
    return fitted


def classify_endpoint(function) -> EndpointSpec:
    """POST /v1/classify backed by ``function``, a DSL classifier with one required
    parameter (the input)."""
    try:
        param = classify_parameter(function)
    except ValueError as e:
        raise ValueError(f"--classify {function.fn.__name__}: {e}") from None
    labels = [str(t) for t in function.labels.texts]

    def room(context) -> int:
        """Input tokens that fit: the longest prompt less the classifier's around it."""
        tokenizer = context.tokenizer
        around = function.prompt(tokenizer, **{param: ""}).text
        return context.limits.scoring_prompt_tokens - len(tokenizer.encode(around)) - JOIN_SLACK

    async def classify(body: object, context) -> ClassifyResponse:
        request = parse_body(ClassifyRequest, body)
        tokenizer = context.tokenizer
        placeholder = context.image_placeholder
        messages, images = chat_with_images(request.messages, placeholder, context.image_refusal)
        texts, field = request_inputs(request, tokenizer, context.limits.vocab_size, messages)
        texts = fit_inputs(texts, field, room(context), request, tokenizer)
        inputs = []
        for i, text in enumerate(texts):
            try:
                inputs.append(function.inputs.validate((), {param: text}))
            except InvalidRequestError as e:
                raise InvalidRequestError(f"{field}[{i}]: {e}") from None
        job = ClassifyJob(function, tuple(inputs))
        if images:  # one input: the chat's text, its images where their placeholders went
            check_placeholders(texts[0], len(images), placeholder)
            prompt = function.prompt(tokenizer, **inputs[0])
            loaded = await _loaded(images)
            where = split_images(prompt, loaded, placeholder)  # (prefix's, item's)
            job = ChatImagesJob(function, job.inputs, None, *where)
        rows = await server_backend(context).run(job)
        answers = [
            (r.label_text, [scores(r.probs[label], request.use_activation) for label in labels])
            for r in function.results(rows)
        ]
        return _response(request, context, answers, function.fn.__name__, labels)

    return EndpointSpec(
        "/v1/classify",
        ClassifyRequest,
        ClassifyResponse,
        classify,
        summary=f"Classify texts ({function.fn.__name__}: {', '.join(labels)})",
        tags=("prefillonly",),
        count_prompts=_count_inputs,
        raw_body=True,
        error_shape=ERROR_SHAPE,
    )


async def _loaded(images) -> list[bytes]:
    """The chat's images as checked bytes (a URL is fetched: off the event loop), each
    error naming its message part."""

    def load() -> list[bytes]:
        return [load_image(image.url, image.where) for image in images]

    return await asyncio.get_running_loop().run_in_executor(None, load)


def _count_inputs(body: dict) -> int:
    """Prompts a /v1/classify body costs for admission control: one per input text."""
    value = body.get("input")
    if isinstance(value, list) and not all(type(v) is int for v in value):
        return len(value)
    return 1


def _response(request, context, answers, function: str, labels) -> ClassifyResponse:
    """The response of (label, probs) per input, in input order."""
    return ClassifyResponse(
        id=f"classify-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model_name(context, request.model),
        data=[
            ClassifyData(index=i, label=label, probs=probs, num_classes=len(labels))
            for i, (label, probs) in enumerate(answers)
        ],
        usage=call_usage(context),
        function=function,
        labels=labels,
    )


async def classify_with_head(request: ClassifyRequest, context, head) -> ClassifyResponse:
    """vLLM's /classify on a head model: per input the softmax of the head's logits (with
    use_activation false, or for a reward model's one score: the logits), and the most
    probable class."""
    tokenizer = context.tokenizer
    _, images = chat_images(request.messages or [])
    if images:
        raise InvalidRequestError(
            f"{images[0].where}: a model's classification head classifies text only"
        )
    texts, field = request_inputs(request, tokenizer, context.limits.vocab_size)
    texts = fit_inputs(texts, field, context.limits.scoring_prompt_tokens, request, tokenizer)
    activate = request.use_activation is not False and not head.is_reward_model
    result = await context.score("", texts, None, apply_softmax=activate)
    labels = list(head.labels)
    answers = [(labels[max(range(len(row)), key=row.__getitem__)], row) for row in result.scores]
    return _response(request, context, answers, f"{head.architecture} (the model's head)", labels)


def scores(probability: float, use_activation: bool | None) -> float:
    """A label's probability, or with use_activation false its log-probability (clamped
    away from 0: JSON has no -infinity)."""
    return math.log(max(probability, 1e-300)) if use_activation is False else probability


def no_classifier_endpoint() -> EndpointSpec:
    """/v1/classify on a server started without --classify: the model's own classification
    head when it has one (each input the whole prompt, its classes the checkpoint's
    id2label), else a 400 saying how to set a classifier."""

    async def classify(body: object, context) -> ClassifyResponse:
        head = context.class_head
        if head is None:
            raise InvalidRequestError(
                "this server has no classifier for /v1/classify: start it with --app FILE "
                "--classify NAME (a @prefillonly.classifier with one input parameter), or "
                "serve a model with a classification head"
            )
        return await classify_with_head(parse_body(ClassifyRequest, body), context, head)

    return EndpointSpec("/v1/classify", ClassifyRequest, ClassifyResponse, classify,
                        summary="Classify texts (the model's head, or no classifier)",
                        tags=("prefillonly",), count_prompts=_count_inputs, raw_body=True,
                        error_shape=ERROR_SHAPE)  # fmt: skip
