"""Who may call what: SGLang's auth levels for the routes we add, the admin key on the
work routes, and custom logit processors (plain Python; SGLang's middleware enforces).

SGLang (sglang.srt.utils.auth) checks `Authorization: Bearer ...` per route by the level
its endpoint function carries (`_auth_level`, set by its `@auth_level` decorator):
- normal: with --api-key, that key (SGLang refuses the admin key here; see below);
- admin_optional: the admin key when one is set, else the API key, else open;
- admin_force: the admin key only; 403 when no admin key is set.
/health*, /ready* and /metrics* are always open (probes, Prometheus).

Every route this project adds declares its level where it is added (AUTH_LEVEL below,
EndpointSpec.auth_level); the table is in docs/server.md.

Two rules of ours on top:
- the admin key opens normal routes too (`admin_key_opens`): an administrator can do what
  a client can, and needs to, since...
- a request carrying `custom_logit_processor` needs the admin key whenever one is set
  (`processor_refusal`): SGLang deserialises it with dill in the scheduler (code from the
  request runs in the server: its CVE-2026-7304), an opt-in (--enable-custom-logit-processor)
  that should not be open to every holder of the ordinary key.
"""

from __future__ import annotations

import hmac

from prefillonly_sgl.server.tenant_keys import MIN_KEY_CHARS

NORMAL = "normal"
ADMIN_OPTIONAL = "admin_optional"
ADMIN_FORCE = "admin_force"
LEVELS = (NORMAL, ADMIN_OPTIONAL, ADMIN_FORCE)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None if it is not one)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


def _matches(authorization: str | None, key: str | None) -> bool:
    token = bearer_token(authorization)
    return bool(key) and token is not None and hmac.compare_digest(token, key)


def admin_key_opens(level: str, authorization: str | None, admin_api_key: str | None) -> bool:
    """Whether the admin key opens a route SGLang refused: normal routes accept it as well
    as the API key (SGLang accepts only the API key there when both are set)."""
    level = getattr(level, "value", level)  # SGLang's AuthLevel (a str Enum) or its value
    return level == NORMAL and _matches(authorization, admin_api_key)


def processor_refusal(
    carries_processor: bool, authorization: str | None, admin_api_key: str | None
) -> str | None:
    """Why a request may not carry a custom logit processor (None: it may): with an admin
    key set, only the admin key may send one."""
    if not carries_processor or not admin_api_key or _matches(authorization, admin_api_key):
        return None
    return (
        "custom_logit_processor runs code from the request in the server: it needs the admin "
        "API key (Authorization: Bearer <--admin-api-key>)"
    )


def authorization_header(scope) -> str | None:
    """The Authorization header of an ASGI request scope."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            return value.decode("latin-1")
    return None


def short_key_refusal(**keys: str | None) -> str | None:
    """Why a server may not start with these keys (None: it may): a key shorter than the
    tenant keys' minimum is a placeholder, guessable, and too short to be searched for in
    every log line (server/redaction.py searches values of 6 characters or more), so it
    could not be kept out of the logs. ``keys``: flag name -> value."""
    for flag, key in keys.items():
        if key is not None and len(key) < MIN_KEY_CHARS:
            return (
                f"{flag} must be at least {MIN_KEY_CHARS} characters (got {len(key)}): a "
                "shorter key is guessable and cannot be kept out of the logs; make one "
                "with e.g. `openssl rand -hex 16`"
            )
    return None


class RequestRefusedError(Exception):
    """A request refused for who sent it (the guard answers ``status`` with the message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
