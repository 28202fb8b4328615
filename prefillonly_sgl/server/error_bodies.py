"""The JSON error body of every refusal this server makes (plain Python).

SGLang's own shape (entrypoints.openai.protocol.ErrorResponse), so stock clients parse
it, or on the paths that ask for it OpenAI's (`{"error": {message, type, param, code}}`,
what the openai client and System One's read) or vLLM's (the same envelope with SGLang's /
vLLM's type names, `BadRequestError`, what vLLM's clients and tests read); one builder for
the guard (raw ASGI) and the FastAPI handlers (validation errors, typed endpoints), so a
status always carries the same `type`. validation_message: a pydantic validation error
as one short line naming each field.
"""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "BadRequestError",
    403: "PermissionDeniedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    503: "ServiceUnavailableError",
}


OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    403: "permission_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "server_error",
}


def error_body(status: int, message: str, shape: str = "sglang") -> bytes:
    if shape in ("openai", "vllm"):
        if shape == "openai":
            kind = OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "error")
        else:
            kind = ERROR_TYPES.get(status, "Error")
        return orjson.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": status}}
        )
    return orjson.dumps(
        {
            "object": "error",
            "message": message,
            "type": ERROR_TYPES.get(status, "Error"),
            "param": None,
            "code": status,
        }
    )


def validation_message(errors) -> str:
    """pydantic's errors (``ValidationError.errors()``, FastAPI's too) as "field: what is
    wrong; ..." (FastAPI's leading "body" left out), at most 1000 characters."""
    parts = []
    for error in errors:
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg"))
    text = "; ".join(p for p in parts if p) or "invalid request"
    return text if len(text) <= 1000 else text[:1000] + "..."


async def send_json_error(send, status: int, message: str, headers=(), shape="sglang") -> None:
    """An error answer sent from ASGI middleware (the guard, compressed bodies)."""
    await send_json(send, status, error_body(status, message, shape), headers)


async def send_json(send, status: int, body: bytes, headers=()) -> None:
    """A JSON body sent from ASGI middleware as one answer."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def parse_body(model, body: object):
    """``body`` read as the pydantic ``model`` (a path that parses its own body), or an
    InvalidRequestError with the message a typed endpoint's validation error gets."""
    from pydantic import ValidationError

    from prefillonly_sgl.scoring.errors import InvalidRequestError

    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise InvalidRequestError(f"invalid request: {validation_message(e.errors())}") from None
