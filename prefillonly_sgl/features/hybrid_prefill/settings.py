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

# Which forwards run in chunks: only those longer than a batch stock SGLang itself would
# build (min(max_prefill_tokens, chunked_prefill_size), and its largest prefill CUDA graph
# bucket), unless the user says otherwise. Below that, chunks only add rounds: on a card
# a small model's forward costs its launches, not its tokens, and a chunked layer runs
# eager with an attention plan per chunk (H200, 2026-11-27: ours chunked every items
# batch over 2048 tokens and served 14 requests/s to stock's 57; benchmarks/README.md).
# The memory hybrid prefilling saves matters for the forwards stock never runs: one
# unchunked long prompt. An explicit chunk size keeps its old meaning (chunks from that
# size on), so small-memory users and the tests that force chunks on short prompts get them.


@dataclass(frozen=True)
class HybridSettings:
    chunk_size: int
    mode: str = DEFAULT_MODE
    # Forwards of at most this many tokens run whole; None: the scheduler's own batch
    # budget (whole_limit below, resolved where SGLang's arguments are).
    whole_up_to: int | None = None

    def __post_init__(self) -> None:
        if self.whole_up_to is not None and (
            type(self.whole_up_to) is not int or self.whole_up_to < 1
        ):
            raise ValueError(
                f"hybrid prefill whole-up-to must be a positive number of tokens, got "
                f"{self.whole_up_to!r}"
            )
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
        cls,
        device: str,
        chunk_size: int | None = None,
        mode: str | None = None,
        whole_up_to: int | None = None,
    ) -> HybridSettings:
        mode = mode if mode is not None else DEFAULT_MODE
        defaults = LAYER_CHUNK_SIZE if mode == "layer" else DEFAULT_CHUNK_SIZE
        if whole_up_to is None and chunk_size is not None:
            whole_up_to = chunk_size  # an explicit chunk: chunks from that size on
        return cls(
            chunk_size if chunk_size is not None else defaults.get(device, 4096),
            mode,
            whole_up_to,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def resolve(
        cls,
        context,
        hybrid_prefill_chunk_size: int | None = None,
        hybrid_prefill_mode: str | None = None,
        hybrid_prefill_whole_up_to: int | None = None,
    ) -> HybridSettings:
        """The feature registry's resolver (features/__init__.py): `context` is runtime_config's
        FeatureContext."""
        return cls.for_device(
            context.device,
            hybrid_prefill_chunk_size,
            hybrid_prefill_mode,
            hybrid_prefill_whole_up_to,
        )

    @classmethod
    def from_dict(cls, values: dict) -> HybridSettings:
        return cls(**values)


def whole_limit(
    settings: HybridSettings,
    max_prefill_tokens: int | None,
    chunked_prefill_size: int | None,
    graph_buckets: list[int] | None = None,
) -> int:
    """The longest forward (tokens) that runs whole: the user's whole_up_to, else the
    largest batch stock SGLang would build with these arguments (its token budget per
    prefill batch, and the largest prefill CUDA graph bucket, which must never capture a
    chunked forward), at least one chunk. Plain Python (the scheduler passes SGLang's
    resolved values)."""
    if settings.whole_up_to is not None:
        return settings.whole_up_to
    budgets = [b for b in (max_prefill_tokens, chunked_prefill_size) if b and b > 0]
    stock_batch = min(budgets) if budgets else 0
    return max(settings.chunk_size, stock_batch, max(graph_buckets or [0]))
