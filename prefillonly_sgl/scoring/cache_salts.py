"""Prefix-cache namespaces (plain Python): which cached prefixes a request may reuse.

SGLang 0.5.23 keys its radix cache by (extra_key, cache_salt, tokens): requests with
different salts never share a cached prefix, so none of them can learn from its cached
tokens (or a hit's latency) whether another's prompt is cached. A request's salt is
decided here from two parts:

- the tenant (`prefillonly serve --tenant-keys`): the name its API key belongs to, set
  per HTTP request by the key check (sglang_runtime/http_server/tenant_requests.py);
- the caller's own `cache_salt` (a route's body field, Engine.score(cache_salt=...), the
  DSL's `with cache_salt(...)`: scoring/call_context.py), set per request or call.

With a tenant, the salt is a hash of both: a tenant's own salt only splits its own cache
further, and no salt a tenant sends can name another tenant's namespace. Without one, the
caller's salt goes to SGLang as is (SGLang's meaning; a server without tenants trusts its
callers). Both travel in the call's context (scoring/call_context.py), and
sglang_runtime/request_recording.py writes the result into every request that reaches
SGLang's generate_request (score, continuations, chat, completions, generate).

Embedding requests (/v1/embeddings, /encode, SGLang's /classify) reach the same prefix
cache, but SGLang 0.5.23 gives them no salt field (EmbeddingReqInput, its tokenized form
and the scheduler's Req for it take none, so every tenant shared one namespace there:
measured, a second tenant's /encode found the first's 511 of 512 tokens cached). Their
salt travels in SamplingParams.custom_params (SALT_PARAM), which SGLang carries to the
Req, and sglang_runtime/embedding_salts.py sets the Req's cache_salt from it. Their bodies'
own `cache_salt` is taken off by the server's guard (BODY_SALT_PATHS, take_body_salt:
SGLang's request models have no such field) and set as the request's salt.
"""

from __future__ import annotations

import hashlib
import json

MAX_SALT_CHARS = 1024  # a salt is a name, not a payload
SALT_PARAM = "prefillonly_cache_salt"  # an embedding request's salt in its custom_params
# SGLang's embedding routes: their request models have no cache_salt (the guard takes it).
BODY_SALT_PATHS = frozenset({"/v1/embeddings", "/encode", "/classify"})


def check_salt(salt: object) -> str | None:
    """`salt` as a cache salt (None or "" for none); ValueError naming the problem."""
    if salt is None or salt == "":
        return None
    if not isinstance(salt, str):
        raise ValueError(f"cache_salt must be a string, got {type(salt).__name__}")
    if len(salt) > MAX_SALT_CHARS:
        raise ValueError(f"cache_salt is longer than {MAX_SALT_CHARS} characters")
    return salt


def effective_salt(tenant: str | None, salt: str | None) -> str | None:
    """The salt SGLang gets for a request of `tenant` carrying `salt`."""
    if tenant is None:
        return salt or None
    # JSON of the pair: (tenant, salt) is recoverable from it, so distinct pairs never
    # collide before hashing; the hash keeps tenant names out of SGLang's cache keys.
    pair = json.dumps([tenant, salt or ""], ensure_ascii=False).encode()
    return "tenant-" + hashlib.sha256(pair).hexdigest()


def take_body_salt(body: object) -> tuple[object, str | None]:
    """(the body without its `cache_salt`, that salt checked) for a route whose SGLang
    request model has no such field (BODY_SALT_PATHS); ValueError naming a bad salt."""
    if not isinstance(body, dict) or "cache_salt" not in body:
        return body, None
    rest = {name: value for name, value in body.items() if name != "cache_salt"}
    return rest, check_salt(body["cache_salt"])


def salt_request(obj, tenant: str | None, salt: str | None) -> None:
    """Writes the effective salt of `tenant` and the call's `salt` into SGLang's request
    `obj`. The request's own `cache_salt` (a chat or generate body's, one per prompt for a
    batch) is the caller's salt where given; else the call's. A request without the field
    (SGLang's EmbeddingReqInput) gets it in its sampling parameters (SALT_PARAM)."""
    if not hasattr(obj, "cache_salt"):
        effective = effective_salt(tenant, salt)
        if effective is not None and hasattr(obj, "sampling_params"):
            obj.sampling_params = with_salt_param(obj.sampling_params, effective)
        return
    own = obj.cache_salt
    if isinstance(own, list):
        # SGLang wants a string per prompt in a list ("" for none).
        obj.cache_salt = [effective_salt(tenant, s or salt) or "" for s in own]
    else:
        obj.cache_salt = effective_salt(tenant, own or salt)


def with_salt_param(sampling_params, salt: str):
    """SGLang's sampling parameters of a request (None, a dict, or one dict per prompt)
    with ``salt`` in each one's custom_params (copies; the caller's dicts untouched)."""

    def one(params: dict | None) -> dict:
        params = dict(params or {})
        params["custom_params"] = {**(params.get("custom_params") or {}), SALT_PARAM: salt}
        return params

    if isinstance(sampling_params, list):
        return [one(params) for params in sampling_params]
    return one(sampling_params)


def salt_param(custom_params) -> str | None:
    """The salt an embedding request carries in its custom_params (None: none)."""
    if isinstance(custom_params, dict):
        return custom_params.get(SALT_PARAM) or None
    return None
