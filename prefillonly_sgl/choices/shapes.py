"""The shape of a choice answer (plain Python): fixed text and slots, in order.

A plain choice (``["positive", "negative"]``) is one slot. A JSON schema of enums and
booleans is fixed JSON text around one slot per field, written compactly in the schema's
property order:

    {"sentiment": enum[...], "side_effects": boolean}
 -> Fixed('{"sentiment":"') Slot(sentiment) Fixed('","side_effects":') Slot(side_effects) Fixed('}')

A slot of string values keeps its quotes in the fixed text around it (the model writes
``":"`` before a word), so its texts are the strings' JSON-escaped contents; a slot with
any other value (a number, null, a boolean) has the values' JSON texts. Objects nest; every
property must be required (an optional one is a choice the grammar makes, not a field:
such a schema keeps SGLang's path), and anything but an enum, a const, a boolean or such
an object (a free string, a number, an array) is outside the shape: None.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_CHOICES = 1024  # per slot: a choice set, not a vocabulary
_MAX_DEPTH = 8  # nested objects


@dataclass(frozen=True)
class Fixed:
    text: str


@dataclass(frozen=True)
class Slot:
    name: str | None  # the field's path ("a.b"), None for a plain choice or a bare enum
    keys: tuple[str, ...]  # each choice's name in choice_probabilities
    texts: tuple[str, ...]  # what the model writes for each choice


Part = Fixed | Slot


@dataclass(frozen=True)
class ChoiceShape:
    parts: tuple[Part, ...]

    @property
    def slots(self) -> tuple[Slot, ...]:
        return tuple(p for p in self.parts if isinstance(p, Slot))

    def fixed_after(self, index: int) -> str:
        """The fixed text right after parts[index] ("" at the end)."""
        following = self.parts[index + 1] if index + 1 < len(self.parts) else None
        return following.text if isinstance(following, Fixed) else ""


class ShapeError(ValueError):
    """A choice set that cannot be answered (empty, repeated, too many)."""


def plain_choices(choices: object, field: str) -> ChoiceShape:
    """vLLM's `choice` list (or a regex's literals): one slot, the strings as written."""
    if not isinstance(choices, list) or not choices:
        raise ShapeError(f"{field} must be a non-empty list of strings, got {choices!r:.80}")
    if not all(isinstance(c, str) and c for c in choices):
        raise ShapeError(f"{field} must be non-empty strings, got {choices!r:.80}")
    texts = tuple(choices)
    _check_distinct(texts, field)
    return ChoiceShape((Slot(None, texts, texts),))


def schema_shape(schema: object) -> ChoiceShape | None:
    """The shape of a JSON schema's answers, or None when the schema is not made of
    enums, consts, booleans and objects of them (see the module docstring)."""
    if not isinstance(schema, dict):
        return None
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
    parts = _parts(schema, defs, None, 0)
    return None if parts is None else ChoiceShape(_merged(parts))


def _parts(node: object, defs: dict, name: str | None, depth: int) -> list[Part] | None:
    node = _resolved(node, defs)
    if not isinstance(node, dict) or depth > _MAX_DEPTH:
        return None
    if "enum" in node:
        return _enum_parts(node["enum"], name)
    if "const" in node:
        return [Fixed(_json(node["const"]))]
    kind = node.get("type")
    if kind == "boolean":
        return [Slot(name, ("true", "false"), ("true", "false"))]
    if kind == "object" or (kind is None and "properties" in node):
        return _object_parts(node, defs, name, depth)
    return None


def _resolved(node: object, defs: dict) -> object:
    """A local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) replaced by its target;
    ``allOf`` of one schema (pydantic's wrapping of a referenced enum) by that schema."""
    for _ in range(_MAX_DEPTH):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            for prefix in ("#/$defs/", "#/definitions/"):
                if ref.startswith(prefix) and ref[len(prefix) :] in defs:
                    node = defs[ref[len(prefix) :]]
                    break
            else:
                return None
        elif (
            isinstance(node, dict)
            and isinstance(node.get("allOf"), list)
            and len(node["allOf"]) == 1
        ):
            node = node["allOf"][0]
        else:
            return node
    return None


def _enum_parts(values: object, name: str | None) -> list[Part] | None:
    if not isinstance(values, list) or not values or len(values) > MAX_CHOICES:
        return None
    texts = [_json(v) for v in values]
    if len(set(texts)) != len(texts):
        return None
    if all(isinstance(v, str) for v in values):
        inner = tuple(t[1:-1] for t in texts)  # the quotes go to the fixed text
        if any(not t for t in inner):
            return None  # "" is no text to score
        return [Fixed('"'), Slot(name, tuple(values), inner), Fixed('"')]
    keys = tuple(v if isinstance(v, str) else t for v, t in zip(values, texts))
    return [Slot(name, keys, tuple(texts))]


def _object_parts(node: dict, defs: dict, name: str | None, depth: int) -> list[Part] | None:
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties:
        return None
    required = node.get("required")
    if not isinstance(required, list) or set(required) != set(properties):
        return None
    parts: list[Part] = [Fixed("{")]
    for i, (key, sub) in enumerate(properties.items()):
        path = key if name is None else f"{name}.{key}"
        inner = _parts(sub, defs, path, depth + 1)
        if inner is None:
            return None
        parts += [Fixed(("," if i else "") + _json(key) + ":"), *inner]
    return [*parts, Fixed("}")]


def _merged(parts: list[Part]) -> tuple[Part, ...]:
    out: list[Part] = []
    for part in parts:
        if isinstance(part, Fixed) and out and isinstance(out[-1], Fixed):
            out[-1] = Fixed(out[-1].text + part.text)
        elif not (isinstance(part, Fixed) and not part.text):
            out.append(part)
    return tuple(out)


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _check_distinct(texts: tuple[str, ...], field: str) -> None:
    if len(texts) > MAX_CHOICES:
        raise ShapeError(f"{field} has {len(texts)} choices; at most {MAX_CHOICES}")
    repeated = sorted({t for t in texts if texts.count(t) > 1})
    if repeated:
        raise ShapeError(f"{field} must be distinct; repeated: {repeated}")
