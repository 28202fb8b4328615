"""A regular expression that is a plain alternation of literal strings, read as those
strings (plain Python): ``positive|negative``, ``(yes|no)``, ``^(?:A|B|C\\.)$``.

Anything else (a character class, a quantifier, a group inside an alternative, an empty
alternative) is not a fixed set of strings: None, and the request keeps SGLang's grammar.
"""

from __future__ import annotations

_META = set(".^$*+?{}[]()|\\")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}


def alternation_literals(pattern: object) -> list[str] | None:
    """The literals of ``a|b|c`` (optionally anchored, optionally in one group), in
    order; None when the pattern is anything else."""
    if not isinstance(pattern, str) or not pattern:
        return None
    body = pattern
    if body.startswith("^"):
        body = body[1:]
    if body.endswith("$") and not _escaped_at(body, len(body) - 1):
        body = body[:-1]
    body = _without_outer_group(body)
    alternatives = _split_top_level(body)
    if alternatives is None:
        return None
    literals = [_literal(a) for a in alternatives]
    if any(lit is None or lit == "" for lit in literals):
        return None
    return literals


def _escaped_at(text: str, index: int) -> bool:
    slashes = 0
    while index - 1 - slashes >= 0 and text[index - 1 - slashes] == "\\":
        slashes += 1
    return slashes % 2 == 1


def _without_outer_group(body: str) -> str:
    """``(...)`` or ``(?:...)`` around the whole pattern, removed."""
    for opening in ("(?:", "("):
        if body.startswith(opening) and body.endswith(")") and not _escaped_at(body, len(body) - 1):
            inner = body[len(opening) : -1]
            if _balanced(inner):
                return inner
    return body


def _balanced(text: str) -> bool:
    depth, i = 0, 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def _split_top_level(body: str) -> list[str] | None:
    parts, current, i = [], [], 0
    while i < len(body):
        char = body[i]
        if char == "\\":
            current.append(body[i : i + 2])
            i += 2
            continue
        if char == "|":
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    parts.append("".join(current))
    return parts


def _literal(alternative: str) -> str | None:
    out, i = [], 0
    while i < len(alternative):
        char = alternative[i]
        if char == "\\":
            if i + 1 >= len(alternative):
                return None
            escaped = alternative[i + 1]
            if escaped in _ESCAPES:
                out.append(_ESCAPES[escaped])
            elif escaped.isalnum() or escaped == "_":  # \d, \w, \b, \1: not a literal
                return None
            else:
                out.append(escaped)
            i += 2
            continue
        if char in _META:
            return None
        out.append(char)
        i += 1
    return "".join(out)
