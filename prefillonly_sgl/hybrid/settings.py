"""Hybrid prefilling's setting (the chunk size), from the Engine's argument or serve's flag
to SGLang's scheduler process, in one environment variable set while SGLang starts."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

SETTINGS_ENV = "PREFILLONLY_HYBRID_PREFILL"

# Tokens per chunk: large enough that a chunk's matmuls run at full speed (the time stays
# that of the unchunked prefill), small enough that its intermediates are a small share of
# a long prompt's memory (benchmarks/README.md measures both).
DEFAULT_CHUNK_SIZE = {"cpu": 2048, "cuda": 4096}


@dataclass(frozen=True)
class HybridSettings:
    chunk_size: int

    def __post_init__(self) -> None:
        if type(self.chunk_size) is not int or self.chunk_size < 16:
            raise ValueError(
                f"hybrid prefill chunk size must be an integer >= 16 tokens, got "
                f"{self.chunk_size!r}"
            )

    @classmethod
    def for_device(cls, device: str, chunk_size: int | None = None) -> HybridSettings:
        return cls(chunk_size if chunk_size is not None else DEFAULT_CHUNK_SIZE.get(device, 4096))

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ=os.environ) -> HybridSettings | None:
        raw = environ.get(SETTINGS_ENV)
        return cls(**json.loads(raw)) if raw else None
