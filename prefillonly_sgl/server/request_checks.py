"""Checks on HTTP request bodies before SGLang sees them (plain Python, no SGLang).

Stock SGLang 0.5.23 answers most malformed requests with a 400, but some kill the whole
server (an empty prompt on /generate or /v1/completions, token ids >= the vocabulary size)
and some succeed silently with nothing (/v1/score with no items). Each check names the
offending field. Every check returns the number of prompts the request asks for, which is
what admission control counts.
"""

from __future__ import annotations

from collections.abc import Callable

from prefillonly_sgl.choices.constraints import is_choice_request
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.validation import (
    ModelLimits,
    TextOrIds,
    validate_label_token_ids,
    validate_score_request,
)
from prefillonly_sgl.single_token.allowed_tokens import check_allowed_token_ids
from prefillonly_sgl.single_token.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    check_shared_prefix,
    check_single_token_body,
    is_loglikelihood,
    is_single_token,
)

try:  # the parser SGLang itself uses: accept exactly what it accepts
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - orjson comes with SGLang
    import json

    _loads = json.loads


class RequestTooLargeError(InvalidRequestError):
    """The request is well-formed but larger than this server accepts (HTTP 413)."""


def parse_json_body(raw: bytes) -> object:
    """The decoded JSON body; raises InvalidRequestError naming the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequestError(
            f"request body is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}"
        ) from None
    if not text.strip():
        raise InvalidRequestError("request body is empty: expected a JSON object")
    try:
        return _loads(raw)
    except ValueError as e:
        raise InvalidRequestError(f"request body is not valid JSON: {e}") from None


def _require_object(body: object) -> dict:
    if not isinstance(body, dict):
        raise InvalidRequestError(
            f"request body must be a JSON object, got a JSON {_json_type(body)}"
        )
    return body


def _json_type(value: object) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def check_prompt_count(n: int, what: str, max_prompts: int) -> None:
    if n > max_prompts:
        raise RequestTooLargeError(
            f"{what} has {n} prompts; this server accepts at most {max_prompts} per request "
            "(split it into smaller requests, or raise --max-pending-prompts)"
        )


def check_score_body(
    body: object,
    limits: ModelLimits,
    count_tokens: Callable[[TextOrIds, TextOrIds], int],
    max_prompts: int,
    labels_required: bool = True,
) -> int:
    """/v1/score (SGLang's ScoringRequest). count_tokens(first, second) is the length of
    the prompt joined first + second (validation.prompt_token_counter)."""
    body = _require_object(body)
    query, items = body.get("query"), body.get("items")
    if items is None:
        raise InvalidRequestError("items is missing: give the list of items to score")
    if isinstance(items, list):
        check_prompt_count(len(items), "items", max_prompts)
    if query is None and isinstance(items, list) and items and isinstance(items[0], list):
        query = []  # SGLang's default query for token-id items
    item_first = body.get("item_first", False)
    if type(item_first) is not bool:
        raise InvalidRequestError(f"item_first must be true or false, got {item_first!r}")

    labels = body.get("label_token_ids")
    if labels is None:
        if labels_required:
            raise InvalidRequestError(
                "label_token_ids is missing: give the token ids of the candidate labels"
            )
        labels = [0]  # classification-head models score without labels
    if isinstance(labels, list) and labels and all(isinstance(x, list) for x in labels):
        # One candidate list per item (SGLang's per-item form).
        n_items = 1 if isinstance(items, str) else len(items) if isinstance(items, list) else -1
        if n_items >= 0 and len(labels) != n_items:
            raise InvalidRequestError(
                f"label_token_ids has {len(labels)} lists for {n_items} items: give one "
                "candidate list per item, or one shared list"
            )
        for i, per_item in enumerate(labels):
            try:
                validate_label_token_ids(per_item, limits.vocab_size)
            except InvalidRequestError as e:
                raise InvalidRequestError(f"label_token_ids[{i}]: {e}") from None
        labels = labels[0]
    _, checked_items, _ = validate_score_request(
        query, items, labels, limits, count_tokens, item_first
    )
    return len(checked_items)


def _check_token_ids(ids: list, name: str, limits: ModelLimits, max_tokens: int | None) -> None:
    if not ids:
        raise InvalidRequestError(f"{name} is empty: give at least one token id")
    for token in ids:
        if type(token) is not int:
            raise InvalidRequestError(f"{name} must contain integer token ids, got {token!r}")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise InvalidRequestError(
            f"{name} has token ids outside the vocabulary (valid ids: 0..{limits.vocab_size - 1})"
            f": {bad[:5]}"
        )
    max_tokens = limits.max_prompt_tokens if max_tokens is None else max_tokens
    if len(ids) > max_tokens:
        raise InvalidRequestError(
            f"{name} is {len(ids)} tokens, longer than the {max_tokens} this server accepts"
        )


def _check_text_or_ids_prompts(
    value: object, name: str, limits: ModelLimits, max_tokens: int | None = None
) -> int:
    """A prompt field that is a string, a list of strings, token ids or lists of token ids
    (each at most max_tokens long; default: the pool-bound limit). Returns the number of
    prompts."""
    if isinstance(value, str):
        if not value:
            raise InvalidRequestError(f"{name} is empty: give a non-empty prompt")
        return 1
    if isinstance(value, list):
        if not value:
            raise InvalidRequestError(f"{name} is empty: give at least one prompt")
        if all(isinstance(v, str) for v in value):
            for i, text in enumerate(value):
                if not text:
                    raise InvalidRequestError(f"{name}[{i}] is empty: give a non-empty prompt")
            return len(value)
        if all(isinstance(v, list) for v in value):
            for i, ids in enumerate(value):
                _check_token_ids(ids, f"{name}[{i}]", limits, max_tokens)
            return len(value)
        if all(type(v) is int for v in value):
            _check_token_ids(value, name, limits, max_tokens)
            return 1
    raise InvalidRequestError(
        f"{name} must be a string, a list of strings, a list of token ids or a list of "
        f"token-id lists, got {_json_type(value)}"
    )


def check_generate_body(body: object, limits: ModelLimits, max_prompts: int) -> int:
    """/generate (SGLang's GenerateReqInput): the prompt fields that can kill the server."""
    body = _require_object(body)
    text, input_ids = body.get("text"), body.get("input_ids")
    if text is not None and input_ids is not None:
        raise InvalidRequestError("give either text or input_ids, not both")
    if text is None and input_ids is None:
        if body.get("input_embeds") is not None:
            return 1
        raise InvalidRequestError("text is missing: give text (or input_ids) to generate from")
    if text is not None:
        n = _check_text_or_ids_prompts(text, "text", limits)
        if not isinstance(text, str) and not all(isinstance(t, str) for t in text):
            raise InvalidRequestError("text must be a string or a list of strings")
    else:
        n = _check_text_or_ids_prompts(input_ids, "input_ids", limits)
        if isinstance(input_ids, list) and any(isinstance(v, str) for v in input_ids):
            raise InvalidRequestError("input_ids must be token ids, not text")
    sampling = body.get("sampling_params")
    if sampling is not None and not isinstance(sampling, dict | list):
        raise InvalidRequestError(f"sampling_params must be an object, got {_json_type(sampling)}")
    if isinstance(sampling, dict):
        n *= _copies(sampling.get("n"), "sampling_params.n")
    check_prompt_count(n, "text" if text is not None else "input_ids", max_prompts)
    return n


def _copies(value: object, name: str) -> int:
    """Parallel samples per prompt (`n`): each is a sequence the server runs."""
    if value is None:
        return 1
    if type(value) is not int or value < 1:
        raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_completions_body(body: object, limits: ModelLimits, max_prompts: int) -> int:
    """/v1/completions (OpenAI): an empty prompt kills stock SGLang like on /generate. A
    single-token or loglikelihood request (single_token/requests.py) may be as long as a
    score prompt."""
    body = _require_object(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequestError("prompt is missing")
    single = _check_openai_extensions(COMPLETIONS_PATH, body, limits)
    one_forward = single or is_loglikelihood(COMPLETIONS_PATH, body)
    max_tokens = limits.scoring_prompt_tokens if one_forward else limits.max_prompt_tokens
    n = _check_text_or_ids_prompts(prompt, "prompt", limits, max_tokens)
    n *= _copies(body.get("n"), "n")
    check_prompt_count(n, "prompt", max_prompts)
    return n


def check_chat_body(body: object, limits: ModelLimits, max_prompts: int) -> int:
    """/v1/chat/completions (OpenAI): SGLang's model checks the messages; here the
    single-token fields and our extensions."""
    body = _require_object(body)
    _check_openai_extensions(CHAT_PATH, body, limits)
    n = _copies(body.get("n"), "n")
    check_prompt_count(n, "request", max_prompts)
    return n


_EXTENSIONS = ("logprob_token_ids", "shared_prefix")


def _check_openai_extensions(path: str, body: dict, limits: ModelLimits) -> bool:
    """Whether the request is single-token (then its fields are checked); our extension
    fields only come with single-token requests; vLLM's allowed_token_ids with any."""
    if body.get("allowed_token_ids") is not None:
        check_allowed_token_ids(body["allowed_token_ids"], limits.vocab_size)
    if is_single_token(path, body):
        check_single_token_body(path, body, limits.vocab_size)
        return True
    if body.get("use_beam_search") and body.get("logprob_token_ids") is not None:
        # vLLM's wording; SGLang's OpenAI routes have no beam search at all
        raise InvalidRequestError(
            "logprob_token_ids is not supported with beam search (use_beam_search)"
        )
    given = [name for name in _EXTENSIONS if body.get(name) is not None]
    if "logprob_token_ids" in given and body.get("max_tokens") == 0:
        # vLLM's wording for the same refusal (its clients and tests match it)
        raise InvalidRequestError(
            "logprob_token_ids: no output tokens are generated with max_tokens: 0 (echo "
            "gives the prompt's own logprobs; ask max_tokens: 1 for the named ids)"
        )
    if given == ["shared_prefix"] and path == COMPLETIONS_PATH and is_choice_request(False, body):
        # a choice request is scored behind its prefix too (choices/, docs/openai.md)
        check_shared_prefix(body["shared_prefix"], body.get("prompt"), limits.vocab_size)
        return False
    if given:
        raise InvalidRequestError(
            f"{given[0]} applies to single-token requests (max_tokens: 1"
            + (" or max_completion_tokens: 1" if path == CHAT_PATH else "")
            + ")"
        )
    return False


def check_object_body(body: object, max_prompts: int | None = None) -> int:
    """Any other JSON work endpoint: a JSON object, one prompt (times OpenAI's `n`)."""
    body = _require_object(body)
    n = _copies(body.get("n"), "n")
    if max_prompts is not None:
        check_prompt_count(n, "request", max_prompts)
    return n


def custom_logit_processors(body: object) -> list[str]:
    """The serialised custom logit processors a request carries (SGLang's
    `custom_logit_processor`: one string, or one per prompt of a batch)."""
    value = body.get("custom_logit_processor") if isinstance(body, dict) else None
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, str)]
