"""Fields and helpers every wire module shares (plain Python, pydantic): the `cache_salt`
every scoring request body carries (the request's prefix-cache namespace:
scoring/cache_salts.py; docs/server.md, "Tenants") and request_body, a request model's
JSON body as a client sends it (checked, fields given only), so a client's request is what
the server's model reads."""

from __future__ import annotations

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
)

from prefillonly_sgl.scoring.cache_salts import MAX_SALT_CHARS
from prefillonly_sgl.scoring.errors import InvalidRequestError

CACHE_SALT_DESCRIPTION = (
    "the request's prefix-cache namespace: it reuses, and reports as cached, only "
    "prefixes cached under the same salt (on a server with --tenant-keys, within its "
    "tenant's)"
)


def cache_salt_field():
    """The `cache_salt` field of a request body (SGLang's name, as its chat and
    completions requests carry it)."""
    return Field(None, max_length=MAX_SALT_CHARS, description=CACHE_SALT_DESCRIPTION)


def request_body(request_model: type[BaseModel], /, **fields) -> dict:
    """The JSON body a client sends: ``fields`` checked against ``request_model``
    (InvalidRequestError, as the server's 400 would be, if they do not fit) and written as
    given (fields not given stay out)."""
    try:
        body = request_model(**fields)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in e.errors()
        )
        raise InvalidRequestError(f"invalid {request_model.__name__}: {problems}") from None
    return body.model_dump(mode="json", exclude_unset=True)
