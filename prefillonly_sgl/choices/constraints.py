"""Which OpenAI requests are choice requests, and what the others become on SGLang's path
(plain Python, on the request's fields as a dict).

The constraint fields, one per request (two are refused, as vLLM refuses them):
- vLLM's `structured_outputs`: `choice`, `regex`, `json`, `grammar`, `json_object`
  (its options `disable_*` and `whitespace_pattern` are read as given and not needed);
- the legacy `guided_choice`, `guided_regex`, `guided_json`, `guided_grammar` (vLLM
  removed them in v0.12 and now ignores them with a 200; here they mean what the sender
  meant);
- `response_format` (OpenAI's `json_schema`; SGLang's `json_object`), SGLang's `regex`,
  `ebnf` and completions' `json_schema` (a JSON string).

A choice list, a regex that is an alternation of literals (regex_literals.py) and a JSON
schema of enums and booleans (shapes.py) are answered by scoring. Everything else runs as
SGLang runs it: SGLang's own fields unchanged, vLLM's translated to them (a choice list
to a regex of its escaped literals, `json` to `response_format` / `json_schema`,
`grammar` to `ebnf`, `json_object` to SGLang's JSON object). A choice request asking for
what scoring cannot honour (FALL_THROUGH_FIELDS: logit_bias, stop strings, penalties,
tools, ...) also runs on SGLang's path under the translated constraint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from prefillonly_sgl.choices.regex_literals import alternation_literals
from prefillonly_sgl.choices.shapes import ChoiceShape, ShapeError, plain_choices, schema_shape
from prefillonly_sgl.scoring.errors import InvalidRequestError

_STRUCTURED_KINDS = ("choice", "regex", "json", "grammar", "json_object")
_STRUCTURED_OPTIONS = (
    "disable_fallback", "disable_any_whitespace", "disable_additional_properties",
    "whitespace_pattern", "backend",
)  # fmt: skip
_LEGACY = {"guided_choice": "choice", "guided_regex": "regex", "guided_json": "json",
           "guided_grammar": "grammar"}  # fmt: skip

# Fields a scored answer cannot honour (name -> the value that means "not asked for"):
# such a request keeps SGLang's grammar path.
FALL_THROUGH_FIELDS = {
    "logit_bias": None, "stop": None, "stop_token_ids": None, "stop_regex": None,
    "tools": None, "echo": False, "suffix": None, "allowed_token_ids": None,
    "logprob_token_ids": None, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_tokens": 0, "return_hidden_states": False,
    "custom_logit_processor": None, "best_of": None, "ignore_eos": False,
}  # fmt: skip


@dataclass(frozen=True)
class Constraint:
    source: str  # the field it came from, as the client wrote it ("guided_choice")
    shape: ChoiceShape | None  # answered by scoring; None: SGLang's path
    # SGLang's fields that carry the constraint on its path (vLLM's translated)
    sglang_fields: dict = field(default_factory=dict)


def find_constraint(fields: dict, chat: bool) -> Constraint | None:
    """The request's output constraint (None: it has none); InvalidRequestError for two
    constraints or a malformed one."""
    found = _given(fields)
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(source for source, _, _ in found)
        raise InvalidRequestError(
            f"give one structured-output constraint, got {len(found)}: {names}"
        )
    source, kind, value = found[0]
    if kind == "json":
        value = _parsed_schema(value, source)
    shape = _shape(source, kind, value)
    if shape is not None and not shape.slots:
        shape = None  # a schema of consts only: nothing to choose, SGLang writes it
    return Constraint(source, shape, _sglang_fields(source, kind, value, chat))


def scorable(constraint: Constraint | None, fields: dict) -> bool:
    """The request is answered by scoring: a choice shape, and nothing asked that
    scoring cannot honour."""
    if constraint is None or constraint.shape is None:
        return False
    return not fall_through_reasons(fields)


def is_choice_request(chat: bool, body: dict) -> bool:
    """A request body answered by scoring (a malformed constraint: False, the route
    refuses it naming the problem)."""
    try:
        return scorable(find_constraint(body, chat), body)
    except InvalidRequestError:
        return False


def fall_through_reasons(fields: dict) -> list[str]:
    """The fields that keep a choice request on SGLang's path."""
    reasons = []
    for name, unset in FALL_THROUGH_FIELDS.items():
        value = fields.get(name)
        if value is None or value == unset or value in ([], {}):
            continue
        if name == "tools" and fields.get("tool_choice") == "none":
            continue
        if name == "best_of" and value == 1:
            continue
        reasons.append(name)
    return reasons


def _given(fields: dict) -> list[tuple[str, str, object]]:
    found = []
    structured = fields.get("structured_outputs")
    if structured is not None:
        if not isinstance(structured, dict):
            raise InvalidRequestError(
                f"structured_outputs must be an object, got {structured!r:.80}"
            )
        unknown = sorted(set(structured) - set(_STRUCTURED_KINDS) - set(_STRUCTURED_OPTIONS))
        if unknown:
            raise InvalidRequestError(
                f"structured_outputs has unknown fields {unknown}; it takes "
                f"{list(_STRUCTURED_KINDS)}"
            )
        for kind in _STRUCTURED_KINDS:
            value = structured.get(kind)
            if value is not None and value is not False:
                found.append((f"structured_outputs.{kind}", kind, value))
    for source, kind in _LEGACY.items():
        if fields.get(source) is not None:
            found.append((source, kind, fields[source]))
    response_format = fields.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
            found.append(("response_format", "json", schema if schema is not None else {}))
        elif kind == "json_object":
            found.append(("response_format", "json_object", True))
        elif kind not in (None, "text"):
            found.append(("response_format", "other", response_format))
    for source, kind in (("regex", "regex"), ("ebnf", "grammar"), ("json_schema", "json")):
        if fields.get(source) is not None:
            found.append((source, kind, fields[source]))
    return found


def _parsed_schema(value: object, source: str) -> object:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{source} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{source} must be a JSON schema object, got {value!r:.80}")
    return value


def _shape(source: str, kind: str, value: object) -> ChoiceShape | None:
    try:
        if kind == "choice":
            return plain_choices(value, source)
        if kind == "regex":
            literals = alternation_literals(value)
            if literals is None or len(set(literals)) != len(literals):
                return None
            return plain_choices(literals, source)
        if kind == "json":
            return schema_shape(value)
    except ShapeError as e:
        raise InvalidRequestError(str(e)) from None
    return None


def _sglang_fields(source: str, kind: str, value: object, chat: bool) -> dict:
    """SGLang's fields for this constraint (the request's own when they are SGLang's)."""
    if source in ("response_format", "regex", "ebnf", "json_schema"):
        return {}
    if kind == "choice":
        return {"regex": "(" + "|".join(re.escape(c) for c in value) + ")"}
    if kind == "regex":
        return {"regex": value}
    if kind == "grammar":
        return {"ebnf": value}
    if kind == "json":
        if chat:
            schema = {"name": "schema", "schema": value}
            return {"response_format": {"type": "json_schema", "json_schema": schema}}
        return {"json_schema": json.dumps(value)}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}} if chat else {
            "json_schema": '{"type": "object"}'
        }  # fmt: skip
    return {}
