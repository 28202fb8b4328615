"""Which OpenAI requests run as prefill-only requests, and the checks on their bodies
(plain Python, no SGLang).

A `/v1/chat/completions` or `/v1/completions` request is *single-token* when it asks for
exactly one output token (chat: `max_completion_tokens`, else `max_tokens`; completions:
`max_tokens`) and nothing that needs the prompt's own logprobs (completions' `echo`,
which the loglikelihood path serves). Such a request is one forward: SGLang's sampler
picks the token from the prefill's last-position logits, and the runtime treats the
request as it treats a score prompt (prefill-only KV keeps only its reusable prefix, the
JCT scheduler groups it with requests sharing that prefix, the score input limit
applies). Every other request keeps SGLang's generation path unchanged.

The checks name the offending field, in OpenAI's limits: `top_logprobs` / `logprobs`
0..20, `logit_bias` keys token ids inside the vocabulary and values -100..100, and our
extensions `logprob_token_ids` (vLLM's: the logprobs of these token ids whatever their
rank) and `shared_prefix` (completions: the text or token ids every prompt starts with,
kept in the prefix cache).
"""

from __future__ import annotations

from prefillonly_sgl.scoring.errors import InvalidRequestError

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
PATHS = (CHAT_PATH, COMPLETIONS_PATH)

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for chat's top_logprobs
MAX_LOGPROB_TOKEN_IDS = 256  # labels per request; far above any label set
MAX_LOGIT_BIAS = 100.0
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default


def output_tokens(path: str, body: dict) -> object:
    """The number of output tokens the request asks for, as given (None: no limit)."""
    if path == CHAT_PATH:
        value = body.get("max_completion_tokens")
        return body.get("max_tokens") if value is None else value
    return body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)


def is_single_token(path: str, body: object) -> bool:
    """True for a request that runs as one prefill-only forward (see the module doc)."""
    if path not in PATHS or not isinstance(body, dict):
        return False
    if type(output_tokens(path, body)) is not int or output_tokens(path, body) != 1:
        return False
    return not (path == COMPLETIONS_PATH and body.get("echo"))


def is_loglikelihood(path: str, body: object) -> bool:
    """A completions request for the prompt's own logprobs (`echo`) generating at most
    one token (`max_tokens` 0 or 1): what evaluation harnesses send. One forward too; it
    keeps its whole prompt in the prefix cache, where the next request of the same task
    (the same few-shot examples, the same question with another choice) finds it."""
    if path != COMPLETIONS_PATH or not isinstance(body, dict) or not body.get("echo"):
        return False
    tokens = output_tokens(path, body)
    return type(tokens) is int and tokens in (0, 1)


def check_single_token_body(path: str, body: dict, vocab_size: int) -> None:
    """The fields a single-token request may carry, checked; InvalidRequestError naming
    the field otherwise."""
    if path == CHAT_PATH:
        logprobs = body.get("logprobs")
        if logprobs is not None and type(logprobs) is not bool:
            raise InvalidRequestError(f"logprobs must be true or false, got {logprobs!r}")
        top = body.get("top_logprobs")
        if top is not None:
            _check_count(top, "top_logprobs")
            if top and not logprobs:
                raise InvalidRequestError("top_logprobs needs logprobs: true")
        wants_logprobs = bool(logprobs)
    else:
        logprobs = body.get("logprobs")
        if type(logprobs) is bool:  # true/false read as 1/0, as SGLang's and vLLM's models do
            logprobs = int(logprobs)
        if logprobs is not None:
            _check_count(logprobs, "logprobs")
        wants_logprobs = logprobs is not None
    _check_logit_bias(body.get("logit_bias"), vocab_size)
    ids = body.get("logprob_token_ids")
    if ids is not None:
        check_logprob_token_ids(ids, vocab_size)
        if not wants_logprobs:
            raise InvalidRequestError(
                "logprob_token_ids needs logprobs"
                + (": true" if path == CHAT_PATH else " (an integer, e.g. 0)")
            )
    if "shared_prefix" in body:
        if path != COMPLETIONS_PATH:
            raise InvalidRequestError(
                "shared_prefix is for /v1/completions; a chat request's reusable prefix is "
                "every message before the last"
            )
        check_shared_prefix(body.get("shared_prefix"), body.get("prompt"), vocab_size)


def _check_count(value: object, name: str) -> None:
    if type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(
            f"{name} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {value!r}"
        )


def _check_logit_bias(bias: object, vocab_size: int) -> None:
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise InvalidRequestError(
            f"logit_bias must be an object mapping token ids to biases, got {bias!r:.80}"
        )
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if str(token) != str(key).strip() or not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"logit_bias keys must be token ids from 0 to {vocab_size - 1}, got {key!r:.40}"
            )
        if type(value) not in (int, float) or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise InvalidRequestError(
                f"logit_bias[{key}] must be a number from -100 to 100, got {value!r:.40}"
            )


def check_logprob_token_ids(ids: object, vocab_size: int) -> list[int]:
    if not isinstance(ids, list) or not ids:
        raise InvalidRequestError(
            f"logprob_token_ids must be a non-empty list of token ids, got {ids!r:.80}"
        )
    if len(ids) > MAX_LOGPROB_TOKEN_IDS:
        raise InvalidRequestError(
            f"logprob_token_ids has {len(ids)} ids; at most {MAX_LOGPROB_TOKEN_IDS} per request"
        )
    bad = [t for t in ids if type(t) is not int or not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(
            f"logprob_token_ids must be token ids from 0 to {vocab_size - 1}, got {bad[:5]!r:.80}"
        )
    if len(set(ids)) != len(ids):
        raise InvalidRequestError("logprob_token_ids has duplicate ids")
    return ids


def check_shared_prefix(prefix: object, prompt: object, vocab_size: int) -> None:
    """`shared_prefix`: text when the prompts are text, token ids when they are ids, and
    every prompt starts with it."""
    prompts = prompt if isinstance(prompt, list) and prompt and not _is_ids(prompt) else [prompt]
    if isinstance(prefix, str):
        if not prefix:
            raise InvalidRequestError("shared_prefix is empty: give the text prompts start with")
        for i, one in enumerate(prompts):
            if not isinstance(one, str):
                raise InvalidRequestError(
                    "shared_prefix is text but the prompts are token ids: give it as token ids"
                )
            if not one.startswith(prefix):
                raise InvalidRequestError(
                    f"prompt{_index(prompts, i)} does not start with shared_prefix"
                )
        return
    if _is_ids(prefix):
        bad = [t for t in prefix if not 0 <= t < vocab_size]
        if bad:
            raise InvalidRequestError(
                f"shared_prefix has token ids outside the vocabulary: {bad[:5]}"
            )
        for i, one in enumerate(prompts):
            if not _is_ids(one):
                raise InvalidRequestError(
                    "shared_prefix is token ids but the prompts are text: give it as text"
                )
            if one[: len(prefix)] != prefix:
                raise InvalidRequestError(
                    f"prompt{_index(prompts, i)} does not start with shared_prefix"
                )
        return
    raise InvalidRequestError(
        f"shared_prefix must be a string or a list of token ids, got {prefix!r:.80}"
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def _index(prompts: list, i: int) -> str:
    return f"[{i}]" if len(prompts) > 1 else ""
