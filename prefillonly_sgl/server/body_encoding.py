"""Compressed request bodies (ASGI middleware, plain Python): a body sent with
`Content-Encoding: zstd` (System One's client compresses every body of 1 KiB or more
whenever zstd is importable), `gzip` or `deflate`, or SGLang's `x-body-compressed: zstd`,
reaches the endpoints decoded, with its content-length set and the encoding header gone.

Bounded both ways: the compressed body and the decoded one are each at most
max_request_bytes (413 beyond, never decoded whole first: a small zstd bomb stays small);
a body that does not decode, or an encoding we do not know, gets a 400 / 415 naming it,
in the path's error shape.
"""

from __future__ import annotations

import zlib

from prefillonly_sgl.server.error_bodies import send_json_error


class BodyTooLarge(Exception):
    pass


def _zstd(data: bytes, limit: int) -> bytes:
    import zstandard  # SGLang's own requirement

    reader = zstandard.ZstdDecompressor().stream_reader(data)
    out = reader.read(limit + 1)
    if len(out) > limit:
        raise BodyTooLarge
    return out


def _zlib(wbits: int):
    def decode(data: bytes, limit: int) -> bytes:
        d = zlib.decompressobj(wbits)
        out = d.decompress(data, limit + 1)
        if len(out) > limit or d.unconsumed_tail:
            raise BodyTooLarge
        return out + d.flush()

    return decode


DECODERS = {"zstd": _zstd, "gzip": _zlib(16 + zlib.MAX_WBITS), "deflate": _zlib(zlib.MAX_WBITS)}


class DecodeRequestBody:
    def __init__(self, app, max_request_bytes: int, error_shapes: dict[str, str] | None = None):
        self.app = app
        self.limit = max_request_bytes
        self.error_shapes = error_shapes or {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        encodings = [
            value.decode("latin-1").strip().lower()
            for name, value in scope.get("headers", ())
            if name in (b"content-encoding", b"x-body-compressed")
        ]
        encodings = [e for e in encodings if e and e != "identity"]
        if not encodings:
            return await self.app(scope, receive, send)
        shape = self.error_shapes.get(scope["path"], "sglang")
        encoding = encodings[0]
        decode = DECODERS.get(encoding)
        if decode is None or len(encodings) > 1:
            named = ", ".join(encodings)
            message = f"Content-Encoding {named} is not supported (zstd, gzip, deflate)"
            return await send_json_error(send, 415, message, shape=shape)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await send_json_error(send, 413, self._too_large("compressed"), shape=shape)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            body = decode(b"".join(chunks), self.limit)
        except BodyTooLarge:
            return await send_json_error(send, 413, self._too_large("decoded"), shape=shape)
        except Exception as e:  # zstd's / zlib's errors: the body is not what it says
            return await send_json_error(
                send, 400, f"the body is not valid {encoding} data ({e})", shape=shape
            )
        headers = [
            (k, v)
            for k, v in scope.get("headers", ())
            if k not in (b"content-encoding", b"x-body-compressed", b"content-length")
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)

    def _too_large(self, which: str) -> str:
        return (
            f"request body is larger than the {self.limit} bytes this server accepts "
            f"({which}; --max-request-bytes)"
        )
