"""`prefillonly verify`'s variants and one engine per variant: the feature sets it runs
(every feature as the family allows it, with a small hybrid chunk; hybrid prefilling's
other mode; each feature off in turn; stock SGLang), each resolved for the model and left
out where the family makes it identical to another (plan_variants); and VariantRuns,
which starts one Engine per variant (or uses the caller's running one), runs the probes
on it (probes.run_probes) and records the variant's result."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.features import FEATURES, STOCK_SGLANG
from prefillonly_sgl.models import families
from prefillonly_sgl.verification.merged_lora import under_adapter
from prefillonly_sgl.verification.probes import (
    SMALL_CHUNK,
    Check,
    Expected,
    Probes,
    first_line,
    run_probes,
)

# SGLang as it ships: the baseline, reported but not judged (stock SGLang may not run a
# family on CPU at all, gpt-oss; or not reuse its prefix, Qwen3.5: not ours to fail).
STOCK = "stock SGLang"


@dataclass
class Variant:
    name: str
    settings: dict  # Engine keyword arguments
    features: tuple[str, ...] = ()  # as resolved for this model
    hybrid_mode: str | None = None


@dataclass
class VariantResult:
    variant: Variant
    checks: dict[str, Check] = field(default_factory=dict)
    error: str | None = None  # the engine did not start
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok for c in self.checks.values())

    @property
    def max_diff(self) -> float | None:
        diffs = [c.max_diff for c in self.checks.values() if c.max_diff is not None]
        return max(diffs) if diffs else None


def plan_variants(model_path: str, device: str, dtype: str, quick: bool):
    """(first: the variants always run, more: each feature off in turn, skipped: why a
    variant is not run). Variants the family makes identical to another are left out.
    An architecture outside the family table is resolved as allowed by name: running its
    variants is what verify is for (until 2026-11-28 each one was refused as unverified,
    so verify could never pass one, issue 74)."""
    allowed = tuple(families.read_architectures(model_path))
    family = families.family_of(allowed)
    # small hybrid chunks test the chunking; a family without hybrid prefilling (it is off
    # there: Qwen2.5-VL's M-RoPE) would have every variant refuse the chunk size
    hybrid_off = family is not None and "hybrid_prefill" in family.features_off()
    chunk = {} if hybrid_off else {"hybrid_prefill_chunk_size": SMALL_CHUNK}
    first = [Variant("all features", dict(chunk))]
    first.append(
        Variant("hybrid token mode", {**chunk, "hybrid_prefill_mode": "token"}),
    )
    more = []
    for feature in FEATURES.values():
        off = {feature.engine_arg: feature.off_value}
        settings = off if feature.name == "hybrid_prefill" else {**chunk, **off}
        more.append(Variant(f"{feature.name} off", settings))
    stock = Variant(STOCK, dict(STOCK_SGLANG))
    if quick:
        first.append(stock)
    else:
        more.append(stock)

    seen: dict[tuple, str] = {}
    skipped: dict[str, str] = {}

    def keep(variant: Variant) -> bool:
        try:
            config, _ = runtime_config.from_engine_args(
                model_path,
                device=device,
                dtype=dtype,
                max_total_tokens=None,
                context_length=None,
                memory_budget=None,
                max_prompt_tokens=None,
                allow_architectures=allowed,
                **variant.settings,
            )
        except ValueError as e:
            skipped[variant.name] = str(e)
            return False
        hybrid = config.settings("hybrid_prefill")
        variant.features = config.features
        variant.hybrid_mode = hybrid.mode if hybrid else None
        # What the engine runs (not what the family reports): features and settings.
        settings = {name: value.to_dict() for name, value in config.worker.settings.items()}
        key = (config.features, json.dumps(settings, sort_keys=True, default=str))
        if key in seen:
            skipped[variant.name] = f"the same configuration as {seen[key]!r} for this model"
            return False
        seen[key] = variant.name
        return True

    first = [v for v in first if keep(v)]
    more = [v for v in more if keep(v)]
    return first, more, skipped


def splits_at_prefix(family, variant: Variant) -> bool:
    """Whether this variant's engine ends a cold prompt's first forward at its reusable
    prefix: a family with a recurrent state there, with prefill-only KV on
    (features/prefill_kv/policy.recurrent_state_plan; its resolved features include the
    prefill-only attention it needs)."""
    return bool(family and family.splits_at_prefix() and "prefill_kv" in variant.features)


@dataclass
class VariantRuns:
    """The variants' runs of one verify: each variant's Engine started with its settings
    (and the caller's engine_args) and shut down after, or the caller's running one from
    ``engines`` (left running); the probes run on it under ``adapter`` (a LoRA adapter's
    name, merged_lora.py; None: none), against the reference's answers as that variant's
    engine computes them (Expected.for_engine_that_splits where it splits at the prefix).
    The first variant's decision probabilities are what the later ones are compared with;
    ``results`` holds each variant's result in the order run."""

    model: str
    device: str
    dtype: str
    architectures: list[str]
    family: families.Family | None
    probes: Probes
    expected: Expected
    tolerance: float
    head: bool
    adapter: str | None
    engine_args: dict
    engines: dict
    progress: Callable[[str], None]
    results: list[VariantResult] = field(default_factory=list)
    first_decision: list[float] | None = None

    def run(self, variant: Variant) -> VariantResult:
        """One variant's result (an engine that does not start, or a probe run that
        raises, is its error), with its progress lines."""
        from prefillonly_sgl.engine import Engine

        progress = self.progress
        progress(f"[verify] {variant.name}: {', '.join(variant.features) or 'no features'}")
        result = VariantResult(variant)
        t0 = time.perf_counter()
        given = self.engines.get(variant.name)
        engine = None
        try:
            engine = given or Engine(
                self.model,
                device=self.device,
                dtype=self.dtype,
                allow_architectures=self.architectures,  # what verify is here to check
                **self.engine_args,
                **variant.settings,
            )
            expected = self.expected
            held_to = (
                expected.for_engine_that_splits()
                if splits_at_prefix(self.family, variant)
                else expected
            )
            with under_adapter(self.adapter):
                result.checks, decision = run_probes(
                    engine, self.probes, held_to, self.tolerance, self.first_decision, self.head
                )
            if self.first_decision is None and decision is not None:
                self.first_decision = decision
        except Exception as e:
            result.error = first_line(e)
            progress("".join(traceback.format_exception_only(type(e), e)).strip()[:2000])
        finally:
            if engine is not None and given is None:
                engine.shutdown()
        result.seconds = time.perf_counter() - t0
        verdict = "pass" if result.ok else f"FAIL {result.error or ''}".strip()
        diff = "" if result.max_diff is None else f", max diff {result.max_diff:.2g}"
        progress(f"[verify]   {verdict}{diff} ({result.seconds:.0f}s)")
        self.results.append(result)
        return result
