"""Where compiled score requests run: a local ``Engine`` or a server speaking SGLang's
``/v1/score`` (prefillonly's own server or a stock ``python -m sglang.launch_server``).

A backend also provides the tokenizer that label compilation and chat templates use. The
remote backend loads it with transformers' AutoTokenizer from ``tokenizer=`` (a folder or
hub name the client can read) or, by default, from the tokenizer path the server reports
at ``/model_info`` — which works when client and server share a file system (the same
machine, a shared volume); otherwise pass ``tokenizer=``.

When the server is ``prefillonly serve --app`` serving the called function itself, the
remote backend posts the call's arguments to that function's typed endpoint instead, and
needs no tokenizer (app_client.py).

Each call picks its backend with ``engine=`` (an Engine, a URL or a Backend); without it
the default set by ``use()`` / ``set_default_backend()`` applies.
"""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Protocol

from prefillonly_sgl.dsl.request import ScoreRequest
from prefillonly_sgl.errors import InvalidRequestError, PrefillOnlyError


class RemoteBackendError(PrefillOnlyError, RuntimeError):
    """The server could not be reached or failed on a valid request."""


class Backend(Protocol):
    """Runs score requests: one probability row per item, in item order."""

    @property
    def tokenizer(self) -> Any: ...

    def score(self, request: ScoreRequest) -> list[list[float]]: ...

    async def ascore(self, request: ScoreRequest) -> list[list[float]]: ...


class LocalEngineBackend:
    """A ``prefillonly_sgl.Engine`` in this process."""

    def __init__(self, engine) -> None:
        self.engine = engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def score(self, request: ScoreRequest) -> list[list[float]]:
        return self.engine.score(**_engine_args(request)).scores

    async def ascore(self, request: ScoreRequest) -> list[list[float]]:
        from prefillonly_sgl.sglang_runtime.event_loop import check_running_loop_is_served

        check_running_loop_is_served(self.engine._require_running())
        return (await self.engine.async_score(**_engine_args(request))).scores

    def __repr__(self) -> str:
        return f"LocalEngineBackend({self.engine!r})"


def _engine_args(request: ScoreRequest) -> dict:
    return dict(
        query=request.query,
        items=list(request.items),
        label_token_ids=list(request.label_token_ids),
        apply_softmax=request.apply_softmax,
    )


class RemoteBackend:
    """A server at ``base_url`` (e.g. "http://127.0.0.1:30000") speaking ``/v1/score``.

    tokenizer: a tokenizer object, or a folder / name for AutoTokenizer; None: the
        server's tokenizer path from ``/model_info``, loaded on first use.
    timeout: seconds per HTTP request.
    typed_endpoints: call a DSL function's own endpoint when the server has it
        (``prefillonly serve --app``, see app_client.py); False: always /v1/score.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any = None,
        timeout: float = 600.0,
        typed_endpoints: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.typed_endpoints = typed_endpoints
        self._tokenizer_source = tokenizer
        self._openapi: dict | None = None

    @functools.cached_property
    def tokenizer(self):
        source = self._tokenizer_source
        if source is not None and not isinstance(source, str | Path):
            return source
        if source is None:
            info = self._request("GET", "/model_info")
            source = info.get("tokenizer_path") or info.get("model_path")
            if not source or not Path(source).is_dir():
                raise RemoteBackendError(
                    f"the server at {self.base_url} serves {source!r}, which is not a folder "
                    f"on this machine; pass RemoteBackend(url, tokenizer=<folder or name>)"
                )
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(source))

    def score(self, request: ScoreRequest) -> list[list[float]]:
        body = {
            "query": request.query,
            "items": list(request.items),
            "label_token_ids": list(request.label_token_ids),
            "apply_softmax": request.apply_softmax,
        }
        return self._request("POST", "/v1/score", body)["scores"]

    async def ascore(self, request: ScoreRequest) -> list[list[float]]:
        return await asyncio.to_thread(self.score, request)

    def endpoint_schema(self, path: str) -> dict | None:
        """The JSON schema of ``POST path``'s request body as the server's /openapi.json
        lists it (read once), or None: no such endpoint, no OpenAPI document there, or
        typed_endpoints=False."""
        if not self.typed_endpoints:
            return None
        if self._openapi is None:
            try:
                doc = self._request("GET", "/openapi.json")
            except InvalidRequestError:  # 404 and the like: a server without one
                doc = {}
            self._openapi = doc if isinstance(doc, dict) else {}
        operation = (self._openapi.get("paths") or {}).get(path, {}).get("post") or {}
        content = (operation.get("requestBody") or {}).get("content") or {}
        schema = (content.get("application/json") or {}).get("schema") or {}
        prefix = "#/components/schemas/"
        if schema.get("$ref", "").startswith(prefix):
            schemas = (self._openapi.get("components") or {}).get("schemas") or {}
            schema = schemas.get(schema["$ref"][len(prefix) :]) or {}
        return schema or None

    def post(self, path: str, body: dict) -> Any:
        """``POST path`` with a JSON body; the decoded JSON answer."""
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            message = _error_message(e)
            if 400 <= e.code < 500:
                raise InvalidRequestError(f"{self.base_url}{path}: {message}") from None
            raise RemoteBackendError(f"{self.base_url}{path}: HTTP {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RemoteBackendError(f"cannot reach {self.base_url}{path}: {e}") from None

    def __repr__(self) -> str:
        return f"RemoteBackend({self.base_url!r})"


def _error_message(error: urllib.error.HTTPError) -> str:
    raw = error.read().decode(errors="replace")
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw
    return str(payload.get("message") or payload.get("detail") or payload)


# -- choosing a backend ----------------------------------------------------------------
_local_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_default: list[Backend | None] = [None]  # the backend set by use() / set_default_backend()


@functools.lru_cache(maxsize=16)
def _remote_backend(url: str) -> RemoteBackend:
    # Cached so that calls naming the same URL share one loaded tokenizer.
    return RemoteBackend(url)


def as_backend(target) -> Backend:
    """An Engine, a server URL or a Backend, as a Backend."""
    from prefillonly_sgl.engine import Engine

    if isinstance(target, str):
        if not target.startswith(("http://", "https://")):
            raise InvalidRequestError(
                f"a server URL must start with http:// or https://: {target!r}"
            )
        return _remote_backend(target.rstrip("/"))
    if isinstance(target, Engine):
        if target not in _local_backends:
            _local_backends[target] = LocalEngineBackend(target)
        return _local_backends[target]
    if _is_backend(target):
        return target
    raise InvalidRequestError(
        f"engine= must be a prefillonly_sgl.Engine, a server URL or a Backend, got {target!r}"
    )


def _is_backend(target) -> bool:
    # Not hasattr(target, "tokenizer"): reading a RemoteBackend's tokenizer would load it.
    has_tokenizer = hasattr(type(target), "tokenizer") or "tokenizer" in getattr(
        target, "__dict__", {}
    )
    return has_tokenizer and all(callable(getattr(target, m, None)) for m in ("score", "ascore"))


def resolve_backend(target=None) -> Backend:
    """The backend for one call: ``target`` when given, else the default."""
    if target is not None:
        return as_backend(target)
    if _default[0] is None:
        raise InvalidRequestError(
            "no backend: pass engine=<Engine | 'http://host:port' | Backend> to the call, "
            "or set a default once with prefillonly_sgl.use(...)"
        )
    return _default[0]


class use:
    """Set the default backend: ``prefillonly.use(engine)`` or ``use("http://host:port")``.

    Also a context manager that restores the previous default on exit::

        with prefillonly.use(engine):
            credit_risk("...")
    """

    def __init__(self, target) -> None:
        self.backend = as_backend(target) if target is not None else None
        self._previous = _default[0]
        _default[0] = self.backend

    def __enter__(self) -> Backend | None:
        return self.backend

    def __exit__(self, *exc) -> None:
        _default[0] = self._previous


def set_default_backend(target) -> Backend | None:
    """Set (or with None, clear) the default backend; returns it."""
    return use(target).backend


def default_backend() -> Backend | None:
    return _default[0]
