"""The prompt-logprob feature's settings: resolved once from the Engine's arguments or
serve's flags (features/__init__.py) and shipped to the scheduler in the runtime configuration.

chunk_size: prompt positions whose logits exist at once. An echo request's logprobs
need log-softmax over the vocabulary at every position; computed whole that is a
[T, vocab] float32 tensor (and its log-softmax beside it: an 8k-token prompt on a
49k-token vocabulary is 1.5 GiB each); in chunks only [chunk, vocab] exists at a time,
and each position keeps its token's logprob and its top-k (SGLang's chunked input-logprob
path, switched on in the scheduler).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# 512 positions x a 49k vocabulary x 4 bytes = 96 MiB per matrix (Llama 3's 128k: 250
# MiB); the lm_head matmul of 512 rows still runs at full speed on CPU and GPU.
DEFAULT_CHUNK_SIZE = 512


@dataclass(frozen=True)
class PromptLogprobSettings:
    chunk_size: int = DEFAULT_CHUNK_SIZE

    def __post_init__(self) -> None:
        if type(self.chunk_size) is not int or self.chunk_size < 1:
            raise ValueError(
                f"prompt logprob chunk size must be a positive integer, got {self.chunk_size!r}"
            )

    def peak_bytes(self, vocab_size: int) -> int:
        """The logits-side peak of one chunk: logits, their log-softmax and a gathered
        copy, float32."""
        return 3 * self.chunk_size * vocab_size * 4

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> PromptLogprobSettings:
        return cls(**values)

    @classmethod
    def resolve(cls, context, prompt_logprob_chunk_size: int | None = None):
        """The feature registry's resolver (features/__init__.py)."""
        if prompt_logprob_chunk_size is None:
            return cls()
        return cls(prompt_logprob_chunk_size)
