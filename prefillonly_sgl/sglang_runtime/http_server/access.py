"""Keys on SGLang's server: the auth level of every route serve adds, the admin key on
work routes, and no secret in any answer or log line (rules: server/auth.py,
server/redaction.py).

SGLang's API-key middleware (added when the server starts, outermost: it answers 401/403
before any body is read) takes each route's level from its endpoint's `_auth_level`. A
route without one is `normal`; every route serve adds states its level where it is added
(`declare`: routes.py, single_token.py, tokenizer_endpoints.py; a typed endpoint's is its
EndpointSpec.auth_level), and serve refuses to start if one does not
(`check_auth_levels`).
"""

from __future__ import annotations

import logging

from prefillonly_sgl.server.auth import ADMIN_FORCE, ADMIN_OPTIONAL, NORMAL, admin_key_opens
from prefillonly_sgl.server.redaction import redact, redact_text
from prefillonly_sgl.sglang_runtime import sglang_state

_ENUM = {NORMAL: "NORMAL", ADMIN_OPTIONAL: "ADMIN_OPTIONAL", ADMIN_FORCE: "ADMIN_FORCE"}

# SGLang's routes that report the server's arguments (SGLang 0.5.23 answers api_key and
# admin_api_key there in plain text, its issue #30166): answered redacted.
SETTINGS_PATHS = ("/server_info", "/get_server_info")


def endpoint_ids(app) -> set[int]:
    """The endpoints on the app now (taken before serve adds its routes)."""
    return {id(getattr(r, "endpoint", None)) for r in app.router.routes}


def declare(endpoint, level: str):
    """Gives a route's endpoint function SGLang's auth level ``level`` (server/auth.py's
    NORMAL, ADMIN_OPTIONAL, ADMIN_FORCE), where the route is added; returns it."""
    from sglang.srt.utils.auth import AuthLevel

    return sglang_state.set_auth_level(endpoint, AuthLevel[_ENUM[level]])


def check_auth_levels(app, before: set[int]) -> dict[str, str]:
    """{path: level} of every route added since ``before`` (docs/server.md's table);
    raises for one added without a declared level (it would silently be normal)."""
    declared: dict[str, str] = {}
    for route in app.router.routes:
        endpoint = getattr(route, "endpoint", None)
        if endpoint is None or id(endpoint) in before:
            continue
        level = sglang_state.auth_level(endpoint)
        if level is None:
            raise RuntimeError(f"serve adds {route.path} without an auth level (access.declare)")
        declared[route.path] = getattr(level, "value", level)
    return declared


def redact_settings_routes(app, secrets: list[str]) -> None:
    """Each of SETTINGS_PATHS keeps SGLang's handler, its answer passed through
    server/redaction.redact (secret fields by name, the launch command's secret flags,
    secret values anywhere), at SGLang's place in the routes and with its auth level."""
    from fastapi.routing import APIRoute

    for path in SETTINGS_PATHS:
        stock = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path]
        if len(stock) != 1:
            raise RuntimeError(f"expected one SGLang {path} route, found {len(stock)}")
        route = stock[0]
        index = app.router.routes.index(route)
        app.router.routes.remove(route)
        app.add_api_route(
            path, _redacted(route.endpoint, secrets), methods=sorted(route.methods), name=route.name
        )
        app.router.routes.insert(index, app.router.routes.pop())  # the first match answers


def _redacted(original, secrets: list[str]):
    import orjson

    async def endpoint():
        answer = await original()
        if hasattr(answer, "body"):  # a Response: its JSON body
            answer = orjson.loads(answer.body)
        return redact(answer, secrets)  # serialised as SGLang's own answer was

    endpoint.__doc__ = original.__doc__
    return sglang_state.set_auth_level(endpoint, sglang_state.auth_level(original) or _normal())


def _normal():
    from sglang.srt.utils.auth import AuthLevel

    return AuthLevel.NORMAL


def _decide_request_auth(original, *args, **kwargs):
    """AROUND sglang.srt.utils.auth.decide_request_auth: the admin key opens normal routes
    too (server/auth.admin_key_opens); SGLang's decision otherwise."""
    decision = original(*args, **kwargs)
    if not decision.allowed and admin_key_opens(
        kwargs.get("auth_level"), kwargs.get("authorization_header"), kwargs.get("admin_api_key")
    ):
        return type(decision)(allowed=True)
    return decision


def _auth_level_of_route(original, app, scope):
    """AROUND sglang.srt.utils.auth._get_auth_level_from_app_and_scope: SGLang's lookup
    does not look inside the routers its app includes (FastAPI's _IncludedRouter), so
    their admin routes (/scale_elastic_ep, /is_scaling_elastic_ep) counted as normal and
    the API key opened them; the level of the route that answers, wherever it is."""
    level = original(app, scope)
    if getattr(level, "value", level) != NORMAL:
        return level
    endpoint = _matching_endpoint(app.router.routes, scope)
    found = sglang_state.auth_level(endpoint)
    return found if found is not None else level


def _matching_endpoint(routes, scope):
    """The endpoint of the first route that fully matches ``scope``, included routers
    searched in place (None if none)."""
    from starlette.routing import Match

    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            prefix = getattr(context, "prefix", "") or ""
            if prefix and not scope.get("path", "").startswith(prefix):
                continue
            inner_scope = {**scope, "path": scope.get("path", "")[len(prefix) :]}
            found = _matching_endpoint(inner.routes, inner_scope)
            if found is not None:
                return found
            continue
        try:
            match, child_scope = route.matches(scope)
        except Exception:
            continue
        if match == Match.FULL:
            return child_scope.get("endpoint") or getattr(route, "endpoint", None)
    return None


# This process's hooks (the serve process: SGLang's HTTP server and its auth middleware).
HOOKS = {
    "sglang.srt.utils.auth.decide_request_auth": ("AROUND", _decide_request_auth),
    "sglang.srt.utils.auth._get_auth_level_from_app_and_scope": ("AROUND", _auth_level_of_route),
}


class _RedactingRecordFactory:
    """Log records of this process with the secret values taken out of their message."""

    def __init__(self, factory, secrets: list[str]) -> None:
        self.factory = factory
        self.secrets = secrets

    def __call__(self, *args, **kwargs):
        record = self.factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record stays as logging would report it
            return record
        cleaned = redact_text(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return record


def redact_logs(secrets: list[str]) -> None:
    """Every log record made in this process from now on has the secrets (long enough to
    search for) redacted; the start-up settings line is redacted by field
    (sglang_runtime/redacted_settings.py)."""
    if secrets:
        logging.setLogRecordFactory(_RedactingRecordFactory(logging.getLogRecordFactory(), secrets))
