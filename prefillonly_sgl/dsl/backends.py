"""Choosing where a DSL call runs: ``engine=`` per call (an Engine, a server URL or a
Backend), else the default set by ``use()`` / ``set_default_backend()``.

The backends themselves: backend.py (the interface), local_backend.py (an Engine in this
process), remote_backend.py (a server, with typed endpoints where it has them).
"""

from __future__ import annotations

import functools
import weakref

from prefillonly_sgl.dsl.backend import Backend, ScoringObjectBackend, is_scoring_object
from prefillonly_sgl.dsl.local_backend import LocalEngineBackend
from prefillonly_sgl.dsl.remote_backend import RemoteBackend
from prefillonly_sgl.errors import InvalidRequestError

_local_backends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_default: list[Backend | None] = [None]  # the backend set by use() / set_default_backend()


@functools.lru_cache(maxsize=16)
def _remote_backend(url: str) -> RemoteBackend:
    # Cached so that calls naming the same URL share one loaded tokenizer.
    return RemoteBackend(url)


def as_backend(target) -> Backend:
    """An Engine, a server URL, a Backend or any object with ``tokenizer``, ``score`` and
    ``ascore``, as a Backend."""
    from prefillonly_sgl.engine import Engine

    if isinstance(target, Backend):
        return target
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
    if is_scoring_object(target):
        return ScoringObjectBackend(target)
    raise InvalidRequestError(
        f"engine= must be a prefillonly_sgl.Engine, a server URL or a Backend, got {target!r}"
    )


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
