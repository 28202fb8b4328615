"""`serve --tenant-keys`: several API keys, one tenant each (server/tenant_keys.py), checked
by SGLang's own rules, and each request run as its key's tenant (the request's context,
scoring/call_context.py, starts here with it: its own prefix-cache namespace).

SGLang's `--api-key` middleware knows one key. With tenant keys, SGLang gets none (serve
refuses both) and this middleware decides each request as SGLang's middleware would with
the presented key as `--api-key` when it is a tenant's (and a key nobody holds when it is
not): SGLang's `decide_request_auth` with the route's auth level (health and metrics open,
admin routes the admin key's, `--admin-api-key` still SGLang's). It runs before any
other of ours, so a refused request's body is never read.
"""

from __future__ import annotations

import secrets

import orjson

from prefillonly_sgl.scoring.call_context import carrying, current
from prefillonly_sgl.server.error_bodies import send_json
from prefillonly_sgl.server.tenant_keys import TenantKeys


class TenantKeyAuth:
    """ASGI middleware: SGLang's auth decision with several keys; the tenant set for the
    request."""

    def __init__(self, app, *, keys: TenantKeys, admin_api_key: str | None, fastapi_app):
        self.app = app
        self.keys = keys
        self.admin_api_key = admin_api_key
        self.fastapi_app = fastapi_app
        # What a key that is no tenant's is checked against: a secret no one holds.
        self._nobody = secrets.token_urlsafe(32)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from sglang.srt.utils.auth import _get_auth_level_from_app_and_scope, decide_request_auth

        authorization = _header(scope, b"authorization")
        tenant = self.keys.tenant_of(_bearer(authorization))
        decision = decide_request_auth(
            method=scope["method"],
            path=scope["path"],
            authorization_header=authorization,
            api_key=_bearer(authorization) if tenant is not None else self._nobody,
            admin_api_key=self.admin_api_key,
            auth_level=_get_auth_level_from_app_and_scope(self.fastapi_app, scope),
        )
        if not decision.allowed:
            status = decision.error_status_code
            # SGLang's answer, word for word, so a client sees one server.
            body = orjson.dumps({"error": "Unauthorized" if status == 401 else "Forbidden"})
            await send_json(send, status, body)
            return
        # The request's context starts here (scoring/call_context.py): the guard's and the
        # endpoint's tasks copy it.
        with carrying(current().replace(tenant=tenant)):
            await self.app(scope, receive, send)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _bearer(authorization: str | None) -> str | None:
    """The key of an "Authorization: Bearer KEY" header (SGLang's reading of it)."""
    if not authorization:
        return None
    parts = authorization.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]
