"""The job-time model: how long a prefill batch takes, from its requests' token counts
(plain Python + numpy).

A prefill-only request's cost is known before it runs. For a batch of requests, each with
`new` uncached tokens to compute after `cached` tokens the prefix cache holds:

    seconds = per_batch + sum over requests of
              per_token * new                (MLP, projections, norms: token-wise work)
            + per_token_cached * new * cached (attention of the new tokens to the prefix)
            + per_token_squared * new^2       (attention among the new tokens, causal)

The last two are the attention term (new * cached + new^2 / 2 pairs of tokens).
`prefillonly profile` measures batches on the running engine and fits the four numbers by
non-negative least squares: every cost grows with tokens, so a fit on a noisy machine can
never predict a longer prompt as cheaper. Without a profile the built-in model of the
engine's dtype applies (DEFAULTS).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

MIN_SECONDS = 1e-4  # a prediction is never below this (a fit may go negative off-grid)


@dataclass(frozen=True)
class JctModel:
    per_batch: float
    per_token: float
    per_token_cached: float
    per_token_squared: float = 0.0
    source: str = "default"  # "default", or where the profile was loaded from

    def work(self, new: int, total: int) -> float:
        """Seconds one request adds to a batch (without the batch's constant)."""
        new = max(int(new), 0)
        cached = max(int(total) - new, 0)
        seconds = (
            self.per_token * new
            + self.per_token_cached * new * cached
            + self.per_token_squared * new * new
        )
        return max(seconds, MIN_SECONDS if new else 0.0)

    def job_time(self, new: int, total: int) -> float:
        """Seconds of a batch holding only this request."""
        return self.per_batch + self.work(new, total)

    def batch_time(self, requests: Iterable[tuple[int, int]]) -> float:
        """Seconds of a batch of (new, total) requests."""
        return self.per_batch + sum(self.work(new, total) for new, total in requests)

    def with_attention_share(self, share: float) -> JctModel:
        """This model for a network of which only `share` of the layers attend over the
        prompt (a hybrid: linear-attention layers cost the same per new token whatever is
        cached, so only the attention layers' share of the two attention terms remains)."""
        if share >= 1.0:
            return self
        return replace(
            self,
            per_token_cached=self.per_token_cached * share,
            per_token_squared=self.per_token_squared * share,
            source=f"{self.source}, attention terms x{share:.3g} (attention layers' share)",
        )

    def coefficients(self) -> dict:
        values = asdict(self)
        values.pop("source")
        return values


# Without a profile: the default model (SmolLM2-135M) as `prefillonly profile` measured it
# on the 2-core CPU development machine with prefill-only attention and KV, per dtype
# (2026-11-24, 25 batches each: cold and cached prompts of 128-2048 tokens, 1-16 hits
# behind one cached prefix; R^2 0.998 / 0.996 / 0.998, benchmarks/README.md). Only the
# ratios matter for the order and for whether a batch pays; the scale matters for aging
# (seconds waited against seconds predicted). Run `prefillonly profile` once per model,
# device and dtype for real numbers.
DEFAULTS = {
    "float32": JctModel(
        per_batch=0.1095, per_token=1.435e-3, per_token_cached=4.17e-7, per_token_squared=3.70e-7
    ),
    "bfloat16": JctModel(
        per_batch=0.0628, per_token=7.89e-4, per_token_cached=5.60e-7, per_token_squared=2.98e-7
    ),
    # No fast float16 kernels on this CPU: ~4x float32's time per token.
    "float16": JctModel(
        per_batch=0.0467, per_token=5.68e-3, per_token_cached=1.90e-6, per_token_squared=7.07e-7
    ),
}
DEFAULT = DEFAULTS["float32"]


def default_model(dtype: str) -> JctModel:
    """The built-in model for a dtype ("auto" or another: float32's)."""
    return DEFAULTS.get(dtype, DEFAULT)


@dataclass(frozen=True)
class Sample:
    """One measured batch: its requests' (new, total) tokens and its seconds."""

    requests: tuple[tuple[int, int], ...]
    seconds: float


@dataclass(frozen=True)
class FitReport:
    samples: int
    r2: float
    relative_error_p50: float
    relative_error_p90: float
    relative_error_max: float

    def summary(self) -> str:
        return (
            f"R^2 {self.r2:.4f} over {self.samples} batches; |relative error| median "
            f"{self.relative_error_p50:.1%}, p90 {self.relative_error_p90:.1%}, "
            f"max {self.relative_error_max:.1%}"
        )


def _features(requests: Sequence[tuple[int, int]]) -> list[float]:
    new = np.array([n for n, _ in requests], dtype=np.float64)
    cached = np.array([t for _, t in requests], dtype=np.float64) - new
    return [1.0, new.sum(), (new * cached).sum(), (new * new).sum()]


def fit(samples: Sequence[Sample], source: str = "profile") -> tuple[JctModel, FitReport]:
    """Non-negative least-squares coefficients over measured batches, weighted so that
    every sample's relative error counts alike (short batches would vanish next to long
    ones otherwise)."""
    if len(samples) < 4:
        raise ValueError(f"need at least 4 measured batches to fit 4 numbers, got {len(samples)}")
    x = np.array([_features(s.requests) for s in samples])
    y = np.array([s.seconds for s in samples])
    weight = 1.0 / np.maximum(y, 1e-6)
    coef = _nonnegative_least_squares(x * weight[:, None], y * weight)
    model = JctModel(*(float(c) for c in coef), source=source)
    return model, report(model, samples)


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| subject to x >= 0, exactly: with 4 unknowns, every subset of
    them free (the rest 0) is solved and the best feasible solution kept."""
    n = a.shape[1]
    best, best_residual = np.zeros(n), float(np.sum(b * b))
    for mask in range(1, 2**n):
        free = [i for i in range(n) if mask >> i & 1]
        x_free, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        if np.any(x_free < 0):
            continue
        x = np.zeros(n)
        x[free] = x_free
        residual = float(np.sum((a @ x - b) ** 2))
        if residual < best_residual:
            best, best_residual = x, residual
    return best


def report(model: JctModel, samples: Sequence[Sample]) -> FitReport:
    """How well `model` predicts `samples`."""
    y = np.array([s.seconds for s in samples])
    predicted = np.array([model.batch_time(s.requests) for s in samples])
    residual = ((y - predicted) ** 2).sum()
    spread = ((y - y.mean()) ** 2).sum()
    relative = np.abs(predicted - y) / np.maximum(y, 1e-9)
    return FitReport(
        samples=len(samples),
        r2=float(1 - residual / spread) if spread > 0 else 1.0,
        relative_error_p50=float(np.quantile(relative, 0.5)),
        relative_error_p90=float(np.quantile(relative, 0.9)),
        relative_error_max=float(relative.max()),
    )
