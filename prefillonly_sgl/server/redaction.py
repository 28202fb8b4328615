"""Which of the server's settings are secrets, and answers with them redacted (plain Python).

SGLang 0.5.23 answers `GET /server_info` with every ServerArgs field, `api_key` and
`admin_api_key` included (its issue #30166; only the watermark keys are redacted), and logs
them at start-up: anyone holding the ordinary key could read the admin key. The rule here
decides by a field's *name*, so a secret field SGLang adds later is covered without a list
to keep up to date:
- a name with the word `key` or `keys` (api_key, admin_api_key, watermark_key_b), or that
  contains `password`, `passwd`, `secret`, `credential` or `authorization`;
- a name whose last word is `token` (hf_token, access_token) when its value is text: the
  many token *counts* (max_total_tokens, kt_max_deferred_experts_per_token) are numbers or
  plural, and tokenizer settings are another word.
Values are redacted wherever they appear: the field itself, the launch command's
`--api-key K` / `--api-key=K`, and any other string in the answer that contains one of the
secret values (`internal_states`, a future field that copies one) when the value is long
enough to be found without mangling unrelated text.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
# A secret shorter than this is only redacted where it is a whole value (a field, an
# argument): searching every string for a 3-letter key would mangle ordinary text.
MIN_SEARCHED_LENGTH = 6

_SECRET_SUBSTRINGS = ("password", "passwd", "secret", "credential", "authorization")


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def is_secret_name(name: str, value: object = "") -> bool:
    """Whether a setting called ``name`` (holding ``value``) is a secret to redact."""
    lowered = name.lower()
    words = _words(name)
    if not words:
        return False
    if "key" in words or "keys" in words or lowered.endswith("apikey"):
        return True
    if any(part in lowered for part in _SECRET_SUBSTRINGS):
        return True
    # A token as a credential is text; counts of tokens are numbers (or plural names).
    return words[-1] == "token" and isinstance(value, str | bytes)


def secret_values(settings: Mapping[str, object]) -> list[str]:
    """The values of the secret settings in ``settings`` (ServerArgs as a dict): what must
    never appear in an answer or a log line."""
    found: set[str] = set()
    for name, value in settings.items():
        if value is None or not is_secret_name(name, value):
            continue
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str | int) and str(item):
                found.add(str(item))
    return sorted(found, key=len, reverse=True)  # longest first: no partial overlaps


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret long enough to search for replaced."""
    for secret in secrets:
        if len(secret) >= MIN_SEARCHED_LENGTH and secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_command_line(command: str, secrets: Iterable[str] = ()) -> str:
    """A launch command (argv joined by spaces) with the value of every secret flag
    (`--api-key K`, `--api-key=K`, `--hf-token T`) redacted, and any secret value
    elsewhere in it."""
    try:
        argv = shlex.split(command)
    except ValueError:  # unbalanced quotes: redact by value only
        return redact_text(command, secrets)
    secrets = list(secrets)
    result: list[str] = []
    redact_next = False
    for argument in argv:
        if redact_next:
            result.append(REDACTED)
            redact_next = False
        elif argument.startswith("-") and "=" in argument:
            flag, value = argument.split("=", 1)
            secret = is_secret_name(flag.lstrip("-")) or value in secrets
            result.append(f"{flag}={REDACTED}" if secret else argument)
        elif argument.startswith("--") and is_secret_name(argument.lstrip("-")):
            result.append(argument)
            redact_next = True
        elif argument in secrets:
            result.append(REDACTED)
        else:
            result.append(argument)
    return redact_text(" ".join(result), secrets)


def redact(value: object, secrets: Iterable[str] = ()) -> object:
    """A JSON-like answer (dicts, lists, strings, numbers) with every secret field
    (is_secret_name) replaced by REDACTED, the launch command's secret flags redacted, and
    every secret value found in another string replaced. A new object; ``value`` is not
    changed."""
    secrets = list(secrets)
    if isinstance(value, Mapping):
        out = {}
        for name, item in value.items():
            if isinstance(name, str) and item is not None and is_secret_name(name, item):
                out[name] = REDACTED
            elif name == "launch_command" and isinstance(item, str):
                out[name] = redact_command_line(item, secrets)
            else:
                out[name] = redact(item, secrets)
        return out
    if isinstance(value, list | tuple):
        return [redact(item, secrets) for item in value]
    if isinstance(value, str):
        return REDACTED if value in secrets else redact_text(value, secrets)
    return value


class RedactSecrets:
    """ASGI middleware: the last line of defence, on every answer of the server (any route,
    error bodies, SGLang's routes present or future): a secret value that reaches a
    response body is replaced. ``secrets()`` is read per response (the server's arguments
    are known once SGLang parsed them). Secrets shorter than MIN_SEARCHED_LENGTH are left
    to the field rule (redact) on the routes that report settings."""

    def __init__(self, app, secrets) -> None:
        self.app = app
        self.secrets = secrets

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wanted = [s.encode() for s in self.secrets() if len(s) >= MIN_SEARCHED_LENGTH]
        if not wanted:
            await self.app(scope, receive, send)
            return
        held: list[dict] = []  # the response's start, until its first body part

        async def scrubbing_send(message):
            if message["type"] == "http.response.start":
                held.append(message)  # sent with the first body part: its length may change
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body = message.get("body", b"")
            found = any(secret in body for secret in wanted)
            if held:
                start = held.pop()
                headers = list(start.get("headers", []))
                if found and not message.get("more_body"):  # the whole body: re-measured
                    for secret in wanted:
                        body = body.replace(secret, REDACTED.encode())
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                    headers.append((b"content-length", str(len(body)).encode()))
                    found = False
                await send({**start, "headers": headers})
            if found:  # a streamed part: masked in place, so a declared length still holds
                for secret in wanted:
                    body = body.replace(secret, b"*" * len(secret))
            await send({**message, "body": body})

        await self.app(scope, receive, scrubbing_send)
