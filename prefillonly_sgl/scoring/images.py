"""Images given to a scoring call, loaded and checked before anything reaches SGLang (plain
Python): every image becomes its encoded bytes, so a bad one is a clear error naming it
(never a failure inside a batch, where SGLang would lose the other prompts), a server
never reads its own files for a client, and the same image always arrives as the same
bytes (SGLang keys an image in the prefix cache by a hash of what it decodes).

An image is: an http(s) URL (fetched here, within FETCH_TIMEOUT_S and MAX_IMAGE_BYTES), a
data URL (`data:image/png;base64,...`), raw bytes, a PIL image, or (the Python API only:
``allow_paths``) a file path or file:// URL. Limits: MAX_IMAGES per call, MAX_IMAGE_BYTES
each, MAX_IMAGE_PIXELS each (a decompression bomb is refused before it is decoded).

    data = load_image(value, "images[0]", allow_paths=False)   # bytes, or InvalidRequestError
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from prefillonly_sgl.scoring.errors import InvalidRequestError

MAX_IMAGES = 16  # per call: every image of the query and the items
MAX_IMAGE_BYTES = 20 * 2**20
MAX_IMAGE_PIXELS = 4096 * 4096
FETCH_TIMEOUT_S = 10.0


def load_image(value, where: str, allow_paths: bool = False) -> bytes:
    """The image's encoded bytes, checked to decode (InvalidRequestError naming ``where``
    and the problem)."""
    data = _bytes_of(value, where, allow_paths)
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequestError(
            f"{where}: the image is {len(data)} bytes, over the {MAX_IMAGE_BYTES} accepted"
        )
    check_decodes(data, where)
    return data


def check_count(n: int) -> None:
    if n > MAX_IMAGES:
        raise InvalidRequestError(f"at most {MAX_IMAGES} images per call, got {n}")


def check_decodes(data: bytes, where: str) -> tuple[int, int]:
    """(width, height) of an encoded image; InvalidRequestError if it does not decode or
    has more than MAX_IMAGE_PIXELS pixels."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size  # read from the header, before any decoding
            if width * height > MAX_IMAGE_PIXELS:
                raise InvalidRequestError(
                    f"{where}: the image is {width}x{height} pixels, over the "
                    f"{MAX_IMAGE_PIXELS} accepted"
                )
            image.load()
    except InvalidRequestError:
        raise
    except Exception as e:  # PIL raises many kinds for a broken file
        raise InvalidRequestError(
            f"{where}: not a decodable image ({type(e).__name__}: {e})"
        ) from None
    return width, height


def _bytes_of(value, where: str, allow_paths: bool) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if _is_pil(value):
        out = io.BytesIO()
        value.save(out, format="PNG")
        return out.getvalue()
    if isinstance(value, dict) and "url" in value:  # OpenAI's {"url": ...} / SGLang's ImageData
        value = value["url"]
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(
            f"{where}: an image must be a URL, a data URL"
            + (", a file path" if allow_paths else "")
            + f" or bytes, got {type(value).__name__}"
        )
    if value.startswith("data:"):
        return _data_url(value, where)
    if value.startswith(("http://", "https://")):
        return _fetch(value, where)
    if allow_paths:
        path = (
            urllib.parse.unquote(urllib.parse.urlparse(value).path)
            if value.startswith("file://")
            else value
        )
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise InvalidRequestError(f"{where}: cannot read {path!r}: {e.strerror}") from None
    raise InvalidRequestError(
        f"{where}: an image must be an http(s) URL or a data URL (data:image/...;base64,...)"
    )


def _is_pil(value) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with transformers' image paths
        return False
    return isinstance(value, Image.Image)


def _data_url(value: str, where: str) -> bytes:
    head, sep, payload = value.partition(",")
    if not sep or not head.endswith(";base64"):
        raise InvalidRequestError(f"{where}: a data URL must be data:<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{where}: the data URL's base64 does not decode") from None


def _fetch(url: str, where: str) -> bytes:
    shown = url if len(url) <= 120 else url[:117] + "..."
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_IMAGE_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise InvalidRequestError(f"{where}: fetching {shown} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise InvalidRequestError(f"{where}: cannot fetch {shown}: {reason}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequestError(f"{where}: {shown} is over the {MAX_IMAGE_BYTES} bytes accepted")
    return data
