"""The fields our /v1/chat/completions and /v1/completions request models add to SGLang's,
and the checks those models run when a body is parsed (plain Python: pydantic models and
functions; sglang_runtime/single_token.py mixes them into SGLang's request models).

Chat and completions take vLLM's `logprob_token_ids` (the logprobs of these token ids
whatever their rank), `allowed_token_ids` (the answer restricted to them:
allowed_tokens.py) and `return_tokens_as_token_ids` (every logprob's token written
"token_id:<id>"); completions also `shared_prefix` (the text or token ids every prompt
starts with, kept in the prefix cache) and `max_tokens: 0` with `echo` (the prompt's own
logprobs only, as OpenAI's API allows and older lm-evaluation-harness versions send;
SGLang refuses 0). vLLM's output constraints are choices/routing.VLLMConstraints.
The checks raise ValueError, which pydantic reports as the body's validation error.
"""

from __future__ import annotations

from pydantic import BaseModel


class SingleTokenFields(BaseModel):
    """vLLM's extensions, taken by both request models."""

    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None


class CompletionsFields(SingleTokenFields):
    """Completions' extensions: vLLM's, and the prompts' `shared_prefix`."""

    shared_prefix: str | list[int] | None = None


def check_response_format_object(values: object) -> None:
    """A chat body's `response_format` and its `schema` are objects (checked before
    SGLang's own set_json_schema, which calls .get on them and so answered a string there
    with a 500)."""
    if isinstance(values, dict):
        response_format = values.get("response_format")
        if response_format and not isinstance(response_format, dict):
            raise ValueError("response_format must be an object")
        schema = response_format.get("schema") if response_format else None
        if schema and not isinstance(schema, dict):
            raise ValueError("response_format.schema must be an object")


def check_max_tokens(value: int | None) -> int | None:
    """Completions' `max_tokens`: 0 or more (SGLang's own check wants more than 0)."""
    if value is not None and value < 0:
        raise ValueError("max_tokens must be 0 or more")
    return value


def check_zero_tokens_need_echo(max_tokens: int | None, echo: object) -> None:
    """`max_tokens: 0` generates nothing: only an echo request (its prompt's own logprobs)
    may ask for it."""
    if max_tokens == 0 and not echo:
        raise ValueError(
            "max_tokens: 0 generates nothing: give echo: true (and logprobs) for the "
            "prompt's own logprobs, or max_tokens >= 1"
        )
