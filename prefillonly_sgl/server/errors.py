"""The JSON error body of every refusal this server makes (plain Python).

SGLang's own shape (entrypoints.openai.protocol.ErrorResponse), so stock clients parse
it, or on the paths that ask for it OpenAI's (`{"error": {message, type, param, code}}`,
what the openai client and System One's read); one builder for the guard (raw ASGI) and
the FastAPI handlers (validation errors, typed endpoints), so a status always carries the
same `type`.
"""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "BadRequestError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    503: "ServiceUnavailableError",
}


OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "server_error",
}


def error_body(status: int, message: str, shape: str = "sglang") -> bytes:
    if shape == "openai":
        kind = OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "error")
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


async def send_json_error(send, status: int, message: str, headers=(), shape="sglang") -> None:
    """An error answer sent from ASGI middleware (the guard, compressed bodies)."""
    body = error_body(status, message, shape)
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
