"""The JSON error body of every refusal this server makes (plain Python).

SGLang's own shape (entrypoints.openai.protocol.ErrorResponse), so stock clients parse
it; one builder for the guard (raw ASGI) and the FastAPI handlers (validation errors,
typed endpoints), so a status always carries the same `type`.
"""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "BadRequestError",
    413: "RequestTooLargeError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps(
        {
            "object": "error",
            "message": message,
            "type": ERROR_TYPES.get(status, "Error"),
            "param": None,
            "code": status,
        }
    )
