"""Input validation from a decorated function's signature, with pydantic (plain Python).

Every call's arguments are bound to the signature and validated against the annotations
before any prompt is built or anything is sent; a wrong type raises InvalidRequestError
naming the parameter, the problem and the value.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from prefillonly_sgl.scoring.errors import InvalidRequestError, PrefillOnlyError


class DeclarationError(PrefillOnlyError, TypeError):
    """A decorated function that cannot be used as declared (found at decoration time)."""


_CONFIG = ConfigDict(arbitrary_types_allowed=True)


class Signature:
    """The parameters of ``fn`` (minus ``exclude``) as a pydantic model."""

    def __init__(self, fn, reserved: tuple[str, ...], exclude: tuple[str, ...] = ()) -> None:
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        self.hints = type_hints(fn)
        fields: dict[str, Any] = {}
        for p in self.signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise DeclarationError(
                    f"{self.name}: *args / **kwargs parameters cannot be validated; "
                    f"declare each parameter"
                )
            if p.name in reserved:
                raise DeclarationError(
                    f"{self.name}: the parameter name {p.name!r} is reserved for the call "
                    f"itself ({', '.join(reserved)}); rename it"
                )
            if p.name in exclude:
                continue
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (self.hints.get(p.name, Any), default)
        self.model: type[BaseModel] = create_model(
            f"{self.name}_inputs", __config__=_CONFIG, **fields
        )
        self.params = [p for p in self.signature.parameters if p not in exclude]
        # What a call binds: the excluded parameters (a ranker's item) are not passed.
        self.call_signature = self.signature.replace(
            parameters=[p for p in self.signature.parameters.values() if p.name not in exclude]
        )

    def validate(self, args: tuple, kwargs: dict) -> dict:
        """Validated keyword arguments for ``fn``, less the excluded parameters."""
        try:
            bound = self.call_signature.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidRequestError(f"{self.name}(): {e}") from None
        try:
            model = self.model.model_validate(dict(bound.arguments))
        except ValidationError as e:
            raise InvalidRequestError(f"{self.name}(): {describe(e)}") from None
        return {name: getattr(model, name) for name in self.params}


def type_hints(fn) -> dict[str, Any]:
    """The function's annotations as types (also under `from __future__ import
    annotations`, where they are strings until resolved in the function's module)."""
    try:
        return typing.get_type_hints(fn)
    except NameError as e:
        raise DeclarationError(
            f"{getattr(fn, '__qualname__', fn)}: cannot resolve an annotation ({e}); "
            f"define the types it names at module level"
        ) from None


def validate_list(name: str, annotation: Any, values: Any) -> list:
    """``values`` validated as a list of ``annotation``."""
    try:
        return TypeAdapter(list[annotation], config=_CONFIG).validate_python(values)
    except ValidationError as e:
        raise InvalidRequestError(f"{name}: {describe(e)}") from None


def describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(x) for x in item["loc"]) or "input"
        parts.append(f"{where}: {item['msg']} (got {item.get('input')!r})")
    return "invalid input: " + "; ".join(parts)
