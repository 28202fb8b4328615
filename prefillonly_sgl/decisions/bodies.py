"""Request bodies of the decision routes parsed into their models, every refusal naming
the field (plain Python): `questions[2].choices[0].value: ...`."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError

from prefillonly_sgl.scoring.errors import InvalidRequestError


def field_path(loc) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


# pydantic's wording for the refusals clients match on, in the peers' words (vLLM's).
_MESSAGES = {
    "extra_forbidden": "unknown field(s): not one this request takes",
    "model_type": "must be an object",
    "dict_type": "must be an object",
}


def validation_message(error: ValidationError, body: object = None, limit: int = 3) -> str:
    parts = []
    for e in error.errors(include_url=False)[:limit]:
        where = field_path(body_loc(e["loc"], body, e["type"] == "missing"))
        msg = _MESSAGES.get(e["type"]) or e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    more = len(error.errors()) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def body_loc(loc, body: object, missing: bool = False) -> list:
    """pydantic's error location as a path in the body: the parts that name a union
    member (`str`, `list[...]`, a discriminator's tag) are not in the body and are
    dropped, found by walking the body along the location; with ``missing`` the last
    part names the field that is missing."""
    out, node = [], body
    for n, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif missing and n == len(loc) - 1 and isinstance(node, dict):
            node = None  # a missing field
        else:
            continue
        out.append(part)
    return out


def parse(model: type[BaseModel], body: object) -> BaseModel:
    if not isinstance(body, dict):
        raise InvalidRequestError(f"the body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise InvalidRequestError(validation_message(e, body)) from None
