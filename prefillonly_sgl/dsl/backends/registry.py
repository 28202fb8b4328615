"""The one registry of DSL backends (plain Python): one backend per Engine, per scoring
object, per serving runtime and per server URL, kept for as long as what it talks to
lives, so every call on the same engine or server shares its tokenizer, its routes and
the calibration priors it has measured (base.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable


class BackendRegistry:
    def __init__(self) -> None:
        self._by_object: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._by_url: dict[str, object] = {}

    def kept(self, target, make: Callable):
        """The one backend of ``target`` (an object, or a server URL), made by
        ``make(target)`` on first use; a new one each time for an object that cannot be
        weakly referenced."""
        if isinstance(target, str):
            if target not in self._by_url:
                self._by_url[target] = make(target)
            return self._by_url[target]
        try:
            backend = self._by_object.get(target)
        except TypeError:
            return make(target)
        if backend is None:
            backend = self._by_object[target] = make(target)
        return backend


REGISTRY = BackendRegistry()
