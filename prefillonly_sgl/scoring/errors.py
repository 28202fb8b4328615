"""Exceptions raised by prefillonly-sgl. All derive from PrefillOnlyError."""

from __future__ import annotations


class PrefillOnlyError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidRequestError(PrefillOnlyError, ValueError):
    """The request is malformed; nothing was sent to the model and the engine is fine."""


class EngineClosedError(PrefillOnlyError, RuntimeError):
    """The engine was shut down (or never started) and cannot score."""


class EngineStartError(PrefillOnlyError, RuntimeError):
    """SGLang's runtime failed to start; the message says what to check."""


class EngineDiedError(EngineClosedError):
    """One of SGLang's worker processes (the scheduler, the detokenizer) died after the
    engine started: the message names it and its last error line. The engine's other
    processes are stopped; create a new Engine. An EngineClosedError, since this engine
    cannot score any more."""
