"""Hybrid prefilling's settings (the chunk size, whole layers or token-wise modules only):
resolved once from the Engine's arguments or serve's flags (feature options, features/__init__.py)
and shipped to SGLang's scheduler process inside the runtime configuration
(config/runtime_config.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Tokens per chunk: large enough that a chunk's matmuls run at full speed (the time stays
# that of the unchunked prefill), small enough that its intermediates are a small share of
# a long prompt's memory (benchmarks/README.md measures both). Whole layers in chunks
# leave only ~1.5 KiB per token whole (SmolLM2, bf16), so there a chunk's own ~20 KiB
# per token of intermediates weighs more: CPU 1024 (measured: the same time as 2048,
# 32 vs 45 MiB of activations for an 8k prompt); CUDA 2048 (measured on an H100, an
# 8B-shaped Llama: a cold 32k prompt's peak 6.5x below the plain forward's against 4.9x at
# 4096, for 2.8% more time; benchmarks/README.md, "What the card measured").
DEFAULT_CHUNK_SIZE = {"cpu": 2048, "cuda": 4096}
LAYER_CHUNK_SIZE = {"cpu": 1024, "cuda": 2048}

# "layer": whole decoder layers run in query chunks, only the residual stream and one
#   layer's K / V whole (layer_chunks.py: every layer with one causal attention and
#   nothing else mixing tokens, where the attention backend can attend a query range),
#   the token-wise modules chunked elsewhere;
# "token": only the token-wise modules (MLPs, norms, rotary) chunked, attention whole
#   (chunking.py; any model with recognised MLPs).
MODES = ("layer", "token")
# Mode "layer" on CUDA attends through FlashInfer's ragged prefill per query chunk
# (features/prefill_attention/flashinfer_chunk.py), opt-in with PREFILLONLY_CUDA_QUERY_CHUNKS=1
# (machine/environment.py) until that path has run on a GPU; without it CUDA layers keep SGLang's
# forward (token-wise chunks only).
DEFAULT_MODE = "layer"


@dataclass(frozen=True)
class HybridSettings:
    chunk_size: int
    mode: str = DEFAULT_MODE

    def __post_init__(self) -> None:
        if type(self.chunk_size) is not int or self.chunk_size < 16:
            raise ValueError(
                f"hybrid prefill chunk size must be an integer >= 16 tokens, got "
                f"{self.chunk_size!r}"
            )
        if self.mode not in MODES:
            raise ValueError(
                f"hybrid prefill mode must be one of {', '.join(MODES)}, got {self.mode!r}"
            )

    @classmethod
    def for_device(
        cls, device: str, chunk_size: int | None = None, mode: str | None = None
    ) -> HybridSettings:
        mode = mode if mode is not None else DEFAULT_MODE
        defaults = LAYER_CHUNK_SIZE if mode == "layer" else DEFAULT_CHUNK_SIZE
        return cls(chunk_size if chunk_size is not None else defaults.get(device, 4096), mode)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> HybridSettings:
        return cls(**values)

    @classmethod
    def resolve(
        cls,
        context,
        hybrid_prefill_chunk_size: int | None = None,
        hybrid_prefill_mode: str | None = None,
    ) -> HybridSettings:
        """The feature registry's resolver (features/__init__.py): `context` is runtime_config's
        FeatureContext."""
        return cls.for_device(context.device, hybrid_prefill_chunk_size, hybrid_prefill_mode)
