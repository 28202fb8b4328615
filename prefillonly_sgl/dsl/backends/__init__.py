"""The DSL's backends, and choosing where a call runs: ``engine=`` per call (an Engine, a
server URL, a Backend or a scoring object), else the default set by ``use()`` /
``set_default_backend()``.

    base.py       the interface every front calls: ``await backend.run(job)``
    local.py      an Engine in this process
    remote.py     a server (its typed endpoints, /v1/score, /v1/score_labels, /generate,
                  or its gateway's standard routes)
    server.py     a serving runtime's own scoring path (serve's handlers)
    registry.py   the one registry: one backend per Engine, per scoring object, per
                  serving runtime and per server URL, kept while that lives (the backend
                  owns the calibration priors it has measured, so every call on the same
                  engine or server shares them)
    ScoringObjectBackend (below): any object with ``tokenizer`` and an async ``ascore``
"""

from __future__ import annotations

from prefillonly_sgl.dsl.backends.base import Backend
from prefillonly_sgl.dsl.backends.local import LocalEngineBackend
from prefillonly_sgl.dsl.backends.registry import REGISTRY
from prefillonly_sgl.dsl.backends.remote import RemoteBackend
from prefillonly_sgl.dsl.request import ScoreRequest
from prefillonly_sgl.scoring.errors import InvalidRequestError

_default: list[Backend | None] = [None]  # the backend set by use() / set_default_backend()


def as_backend(target) -> Backend:
    """An Engine, a server URL, a Backend or any object with ``tokenizer`` and an async
    ``ascore``, as a Backend."""
    from prefillonly_sgl.engine import Engine

    if isinstance(target, Backend):
        return target
    if isinstance(target, Engine):
        return REGISTRY.kept(target, LocalEngineBackend)
    if is_scoring_object(target):
        return REGISTRY.kept(target, ScoringObjectBackend)
    if not isinstance(target, str):
        raise InvalidRequestError(
            f"engine= must be a prefillonly_sgl.Engine, a server URL or a Backend, got {target!r}"
        )
    return _remote_backend(target)


def _remote_backend(url: str) -> RemoteBackend:
    """The one backend of a server URL: calls naming it share its loaded tokenizer, its
    routes and its priors."""
    if not url.startswith(("http://", "https://")):
        raise InvalidRequestError(f"a server URL must start with http:// or https://: {url!r}")
    return REGISTRY.kept(url.rstrip("/"), RemoteBackend)


class ScoringObjectBackend(Backend):
    """Any object with ``tokenizer`` and an async ``ascore(ScoreRequest)`` as a Backend."""

    def __init__(self, target) -> None:
        self.target = target

    @property
    def tokenizer(self):
        return self.target.tokenizer

    async def score(self, request: ScoreRequest) -> list[list[float]]:
        return await self.target.ascore(request)

    def __repr__(self) -> str:
        return repr(self.target)


def is_scoring_object(target) -> bool:
    # Not hasattr(target, "tokenizer"): reading a remote tokenizer property would load it.
    has_tokenizer = hasattr(type(target), "tokenizer") or "tokenizer" in getattr(
        target, "__dict__", {}
    )
    return has_tokenizer and callable(getattr(target, "ascore", None))


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
