"""`prefillonly verify MODEL`: a model's scores through the Engine against transformers,
feature by feature, before trusting a family (or an architecture outside the table,
models/families.py) in production.

For each variant of the runtime features (every feature as the family allows it, with a
small hybrid chunk so long prompts are chunked; hybrid prefilling's other mode; each
feature off in turn; stock SGLang) it starts one Engine and scores the same probes:

    cold        single-token labels over the whole vocabulary, the first call
    cached      the same call again (the prefix cache must hit: cached tokens > 0)
    long        a prompt longer than the config's sliding window and the hybrid chunk
    labels      labels of several tokens (the chain rule, normalised)
    echo        every prompt position's logprob (lm-eval's echo; the prompt-logprob
                cache), asked twice so the second is served from the cache
    continuation  Engine.continuation_logprobs (query likelihood)
    decisions   Engine.decide: runs, and its probabilities against the first variant's

and compares each with a float32 transformers forward (verification/reference.py),
computed once. The report is the largest difference per probe and variant, and per feature (over the
variants that ran with it), pass / fail at the tolerance. `--quick` starts the
every-feature engines and stock SGLang only, and each feature off in turn only when one
of those fails while stock SGLang passes (to find which).

A model with a classification head is checked by its class logits (cold, cached, long;
the token probes do not apply). `--lora ADAPTER` loads a LoRA adapter in every variant's
engine and runs every probe under it, against transformers with the adapter merged.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.features import FEATURES, STOCK_SGLANG
from prefillonly_sgl.models import families, verified_architectures

SMALL_CHUNK = 16  # hybrid prefilling's smallest chunk: the long probe runs in several
# SGLang as it ships: the baseline, reported but not judged (stock SGLang may not run a
# family on CPU at all, gpt-oss; or not reuse its prefix, Qwen3.5: not ours to fail).
STOCK = "stock SGLang"
PROBES = ("cold", "cached", "long", "labels", "echo", "continuation", "decisions")
_QUERY = (
    "User profile: likes science fiction, history books and long walks.\n"
    "Question: is this item relevant to the user? Answer Yes or No.\n"
)
_SHORT_ITEM = "Item: a documentary about the history of the moon landing.\nAnswer:"
_FILLER = (
    "Credit history: two loans, one late payment, savings account, owns a house. "
    "Review: this medicine worked well and I feel much better now. "
)
_STATE = "Review: terrible side effects, I would not take it again."


@dataclass
class Variant:
    name: str
    settings: dict  # Engine keyword arguments
    features: tuple[str, ...] = ()  # as resolved for this model
    hybrid_mode: str | None = None


@dataclass
class Check:
    max_diff: float | None = None
    ok: bool = False
    error: str | None = None
    applies: bool = True  # False: the probe means nothing for this model (a head's labels)


NOT_FOR_HEADS = "n/a: a classification head answers its classes, not tokens"
HEAD_PROBES = ("cold", "long", "cached")  # what a classification head answers


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


@dataclass
class Report:
    model: str
    family: str | None
    architectures: list[str]
    device: str
    dtype: str
    tolerance: float
    features_off: dict[str, str]
    results: list[VariantResult]
    skipped: dict[str, str]  # variant -> why it was not run
    head: bool = False  # a classification head: its class scores are what is checked
    lora: str | None = None  # a LoRA adapter every probe ran under (against it merged)

    @property
    def judged(self) -> list[VariantResult]:
        """The variants that run prefillonly's code (all but stock SGLang)."""
        return [r for r in self.results if r.variant.name != STOCK]

    @property
    def ok(self) -> bool:
        return bool(self.judged) and all(r.ok for r in self.judged)

    def feature_summary(self) -> dict[str, dict]:
        """feature (and hybrid prefilling's modes, several-token labels, prompt logprobs,
        decisions) -> {"status": pass / fail / off: why / not run, "max_diff"}."""
        rows = {}
        keys = list(FEATURES) + ["hybrid_prefill:layer", "hybrid_prefill:token"]
        for key in keys:
            name, _, mode = key.partition(":")
            ran = [
                r
                for r in self.judged
                if name in r.variant.features and (not mode or r.variant.hybrid_mode == mode)
            ]
            rows[key] = _summarise(ran, self.features_off.get(key), self.tolerance)
        for probe, label in (("labels", "several-token labels"), ("decisions", "decisions")):
            rows[label] = (
                {"status": NOT_FOR_HEADS, "max_diff": None}
                if self.head
                else _summarise(self.judged, None, self.tolerance, probe)
            )
        stock = [r for r in self.results if r.variant.name == STOCK]
        rows[STOCK] = _summarise(stock, None, self.tolerance)
        return rows

    def table(self) -> str:
        head = ["variant", *PROBES, "result"]
        rows = []
        for r in self.results:
            baseline = " (baseline)" if r.variant.name == STOCK else ""
            if r.error:
                rows.append([r.variant.name, *["-"] * len(PROBES), f"FAIL{baseline}: {r.error}"])
                continue
            cells = [_cell(r.checks.get(p)) for p in PROBES]
            rows.append([r.variant.name, *cells, ("pass" if r.ok else "FAIL") + baseline])
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [head, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append("")
        lines.append(f"per feature (tolerance {self.tolerance:g}):")
        for key, row in self.feature_summary().items():
            diff = "" if row["max_diff"] is None else f"  max diff {row['max_diff']:.2g}"
            lines.append(f"  {key:24} {row['status']}{diff}")
        for name, why in self.skipped.items():
            lines.append(f"  (not run: {name}: {why})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "family": self.family,
            "architectures": self.architectures,
            "head": self.head,
            "lora": self.lora,
            "device": self.device,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "features_off": self.features_off,
            "ok": self.ok,
            "features": self.feature_summary(),
            "variants": [
                {
                    "name": r.variant.name,
                    "settings": r.variant.settings,
                    "features": list(r.variant.features),
                    "hybrid_mode": r.variant.hybrid_mode,
                    "ok": r.ok,
                    "error": r.error,
                    "seconds": round(r.seconds, 1),
                    "checks": {name: asdict(c) for name, c in r.checks.items()},
                }
                for r in self.results
            ],
            "skipped": self.skipped,
        }


def _summarise(results, off_reason, tolerance, probe=None) -> dict:
    if not results:
        status = f"off: {off_reason}" if off_reason else "not run"
        return {"status": status, "max_diff": None}
    checks = [c for r in results for name, c in r.checks.items() if probe is None or name == probe]
    errors = [r.error for r in results if r.error] + [c.error for c in checks if c.error]
    diffs = [c.max_diff for c in checks if c.max_diff is not None]
    ok = not errors and all(c.ok for c in checks)
    status = "pass" if ok else ("FAIL: " + errors[0] if errors else "FAIL")
    return {"status": status, "max_diff": max(diffs) if diffs else None}


def _cell(check: Check | None) -> str:
    if check is None:
        return "-"
    if not check.applies:
        return "n/a"
    if check.error:
        return "ERROR"
    text = "0" if not check.max_diff else f"{check.max_diff:.1e}"
    return text if check.ok else f"{text} X"


# -- the probes --------------------------------------------------------------------------
@dataclass
class Probes:
    query: str
    items: list[str]
    labels: list[int]
    sequences: list[list[int]]
    echo_ids: list[int]
    continuation: str
    long_tokens: int


def sliding_window_of(config: dict) -> int | None:
    """The config's sliding window (text_config's for a ConditionalGeneration one), None
    without one or where layer_types has no sliding layer."""
    text = config.get("text_config") or config
    window = text.get("sliding_window")
    types = text.get("layer_types")
    if types is not None and "sliding_attention" not in types:
        return None
    if text.get("use_sliding_window") is False:
        return None
    return int(window) if window else None


def make_probes(tokenizer, config: dict) -> Probes:
    """Prompts for this model: the long one crosses the sliding window (if any) and the
    small hybrid chunk several times."""
    window = sliding_window_of(config) or 0
    target = max(3 * SMALL_CHUNK, 2 * window + 8)
    long_item = _SHORT_ITEM
    while len(tokenizer.encode(_QUERY + long_item)) <= target:
        long_item = _FILLER + long_item
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    labels = [encode(" Yes")[0], encode(" No")[0]]
    if labels[0] == labels[1]:
        labels = [encode("Yes")[0], encode("No")[0]]
    sequences = [encode(w) for w in (" Yes", " No", " not really sure")]
    if all(len(s) == 1 for s in sequences):
        sequences.append(labels[::-1])
    return Probes(
        query=_QUERY,
        items=[_SHORT_ITEM, long_item],
        labels=labels,
        sequences=sequences,
        echo_ids=tokenizer.encode(_QUERY + long_item),
        continuation=" Yes, it is relevant.",
        long_tokens=len(tokenizer.encode(_QUERY + long_item)),
    )


@dataclass
class Expected:
    """The reference's answers, computed once."""

    scores: list[list[float]]
    sequences: list[list[float]]
    echo: list[float | None]
    continuation: list[list[float]]
    # The continuation computed in two forwards split at the query's end, as an engine
    # with prefill-only KV computes a recurrent family's cold prompt (None: not needed).
    continuation_split: list[list[float]] | None = None

    def for_engine_that_splits(self) -> Expected:
        """The answers an engine that splits at the prefix is held to: the same, with the
        continuation computed as it computes it. Float32 makes the two orders differ by
        more than the tolerance on some checkpoints (transformers itself: 3.1e-4 on one
        token of the tiny Qwen3.5-MoE, seed 0), which is the model's conditioning, not
        the engine's error (docs/models.md, "The families, measured")."""
        if self.continuation_split is None:
            return self
        return replace(self, continuation=self.continuation_split)


def reference_answers(
    reference, probes: Probes, split_at_query: bool = False, head: bool = False
) -> Expected:
    """split_at_query: also the continuation split where the query ends (a family whose
    cold prompts prefill-only KV splits there, Family.splits_at_prefix). head: a
    classification head's logits are the scores, and nothing else is asked."""
    if head:
        scores = reference.class_scores(probes.query, probes.items, apply_softmax=False)
        return Expected(scores=scores, sequences=[], echo=[], continuation=[])
    split = (
        reference.continuation_logprobs(
            probes.query, probes.items, probes.continuation, split_at_query=True
        )
        if split_at_query
        else None
    )
    return Expected(
        scores=reference.score(probes.query, probes.items, probes.labels, apply_softmax=False),
        sequences=reference.score_sequences(probes.query, probes.items, probes.sequences),
        echo=reference.prompt_logprobs(probes.echo_ids),
        continuation=reference.continuation_logprobs(
            probes.query, probes.items, probes.continuation
        ),
        continuation_split=split,
    )


def splits_at_prefix(family, variant: Variant) -> bool:
    """Whether this variant's engine ends a cold prompt's first forward at its reusable
    prefix: a family with a recurrent state there, with prefill-only KV on
    (features/prefill_kv/policy.recurrent_state_plan; its resolved features include the
    prefill-only attention it needs)."""
    return bool(family and family.splits_at_prefix() and "prefill_kv" in variant.features)


def max_abs_diff(a, b) -> float:
    """The largest |a - b| over nested lists (None entries must be None in both)."""
    if isinstance(a, list | tuple):
        if not isinstance(b, list | tuple) or len(a) != len(b):
            raise ValueError(f"shapes differ: {len(a)} vs {b!r:.80}")
        return max((max_abs_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if a is None or b is None:
        if a is None and b is None:
            return 0.0
        raise ValueError("a value is missing")
    diff = abs(float(a) - float(b))
    return math.inf if math.isnan(diff) else diff


def _decision_probabilities(decision) -> list[float]:
    return [p.probability for answer in decision.answers for p in answer.probabilities]


def run_probes(
    engine, probes: Probes, expected: Expected, tolerance: float, first_decision, head=False
):
    """Each probe's Check on one engine; returns (checks, the decision's probabilities).
    head: a classification head's class scores (cold, long, cached; no labels sent)."""
    from prefillonly_sgl.sglang_runtime.echo_logprobs import echo_prompt_logprobs

    checks: dict[str, Check] = {}
    cold_rows = []  # the cold call's rows: its second item is the long probe
    decision_probs = None

    def check(name, compute):
        try:
            diff = compute()
            checks[name] = Check(diff, diff <= tolerance)
        except Exception as e:  # a probe's failure is a result, not the end of the run
            checks[name] = Check(None, False, _first_line(e))

    labels = None if head else probes.labels

    def cold():
        got = engine.score(probes.query, probes.items, labels, apply_softmax=False)
        cold_rows.extend(got.scores)
        return max_abs_diff(got.scores[:1], expected.scores[:1])

    def long():
        return max_abs_diff(cold_rows[1:], expected.scores[1:])

    def cached():
        got = engine.score(probes.query, probes.items, labels, apply_softmax=False)
        if got.cached_tokens <= 0:
            raise AssertionError("the repeated call took no token from the prefix cache")
        return max_abs_diff(got.scores, expected.scores)

    def several_token_labels():
        got = engine.score(probes.query, probes.items, probes.sequences)
        return max_abs_diff(got.scores, expected.sequences)

    def echo():
        diffs = []
        for _ in range(2):  # the second is a cache hit: served from the side table
            got = engine.run_until_complete(
                echo_prompt_logprobs(engine.tokenizer_manager, probes.echo_ids)
            )
            diffs.append(max_abs_diff(got, expected.echo))
        return max(diffs)

    def continuation():
        got = engine.continuation_logprobs(probes.query, probes.items, probes.continuation)
        return max_abs_diff(got.token_logprobs, expected.continuation)

    def decisions():
        nonlocal decision_probs
        decision = engine.decide(
            _STATE,
            [
                {
                    "type": "choice",
                    "instructions": "How does the reviewer feel?",
                    "choices": [{"value": "good"}, {"value": "very bad"}],
                }
            ],
        )
        decision_probs = _decision_probabilities(decision)
        if abs(sum(decision_probs) - 1) > 1e-6:
            raise AssertionError(f"probabilities sum to {sum(decision_probs)}")
        return 0.0 if first_decision is None else max_abs_diff(decision_probs, first_decision)

    check("cold", cold)
    if cold_rows:
        check("long", long)
    else:
        checks["long"] = Check(None, False, "the cold call failed")
    check("cached", cached)
    if head:
        for name in PROBES:
            checks.setdefault(name, Check(ok=True, applies=False))
        return {name: checks[name] for name in PROBES}, None
    check("labels", several_token_labels)
    check("echo", echo)
    check("continuation", continuation)
    check("decisions", decisions)
    return {name: checks[name] for name in PROBES}, decision_probs


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# -- the variants ------------------------------------------------------------------------
def plan_variants(model_path: str, device: str, dtype: str, quick: bool):
    """(first: the variants always run, more: each feature off in turn, skipped: why a
    variant is not run). Variants the family makes identical to another are left out.
    An architecture outside the family table is resolved as allowed by name: running its
    variants is what verify is for (until 2026-11-28 each one was refused as unverified,
    so verify could never pass one, issue 74)."""
    allowed = tuple(families.read_architectures(model_path))
    chunk = {"hybrid_prefill_chunk_size": SMALL_CHUNK}
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


def verify(
    model: str | Path,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    tolerance: float = 1e-4,
    quick: bool = False,
    variants: list[str] | None = None,
    engines: dict | None = None,
    progress: Callable[[str], None] = print,
    engine_args: dict | None = None,
    lora: str | Path | None = None,
) -> Report:
    """Check `model` against transformers (see the module docstring). variants: names to
    run (default: all, or --quick's); engines: {variant name: a running Engine} to use
    instead of starting one (it must have that variant's settings; it is not shut down);
    engine_args: more Engine keyword arguments for every variant. lora: a LoRA adapter's
    folder: every variant's engine loads it and every probe runs under it, against
    transformers with the adapter merged (peft's merge_and_unload)."""
    from prefillonly_sgl.engine import Engine
    from prefillonly_sgl.verification.reference import TransformersReference

    model = str(model)
    config_json = json.loads((Path(model) / "config.json").read_text())
    architectures = families.read_architectures(model)
    family = families.family_of(architectures)
    head = families.has_head(architectures)
    features_off = family.features_off() if family else {}
    first, more, skipped = plan_variants(model, device, dtype, quick)
    if variants is not None:
        unknown = set(variants) - {v.name for v in first + more} - set(skipped)
        if unknown:
            raise ValueError(f"unknown variants {sorted(unknown)}")
        first = [v for v in first + more if v.name in variants]
        more = []
    family_name = family.title if family else "outside the family table"
    progress(f"[verify] {model}: {', '.join(architectures) or '?'} ({family_name})")

    started = time.perf_counter()
    merged = None
    if lora is not None:
        merged = tempfile.TemporaryDirectory(prefix="prefillonly-verify-lora-")
        progress(f"[verify] the adapter {lora}, merged into the reference")
        reference = TransformersReference(
            merge_adapter(model, str(lora), merged.name, dtype), dtype=dtype, device=device
        )
        engine_args = {
            **(engine_args or {}),
            "enable_lora": True,
            "lora_paths": [f"{LORA_NAME}={lora}"],
        }
    else:
        reference = TransformersReference(model, dtype=dtype, device=device)
    probes = make_probes(reference.tokenizer, config_json)
    expected = reference_answers(
        reference, probes, bool(family and family.splits_at_prefix()), head
    )
    progress(
        f"[verify] transformers reference: {time.perf_counter() - started:.1f}s "
        f"(long prompt {probes.long_tokens} tokens)"
    )

    results: list[VariantResult] = []
    first_decision = None

    def run(variant: Variant) -> VariantResult:
        nonlocal first_decision
        progress(f"[verify] {variant.name}: {', '.join(variant.features) or 'no features'}")
        result = VariantResult(variant)
        t0 = time.perf_counter()
        given = (engines or {}).get(variant.name)
        engine = None
        try:
            engine = given or Engine(
                model,
                device=device,
                dtype=dtype,
                allow_architectures=architectures,  # what verify is here to check
                **(engine_args or {}),
                **variant.settings,
            )
            held_to = (
                expected.for_engine_that_splits() if splits_at_prefix(family, variant) else expected
            )
            with under_adapter(LORA_NAME if lora is not None else None):
                result.checks, decision = run_probes(
                    engine, probes, held_to, tolerance, first_decision, head
                )
            if first_decision is None and decision is not None:
                first_decision = decision
        except Exception as e:
            result.error = _first_line(e)
            progress("".join(traceback.format_exception_only(type(e), e)).strip()[:2000])
        finally:
            if engine is not None and given is None:
                engine.shutdown()
        result.seconds = time.perf_counter() - t0
        verdict = "pass" if result.ok else f"FAIL {result.error or ''}".strip()
        diff = "" if result.max_diff is None else f", max diff {result.max_diff:.2g}"
        progress(f"[verify]   {verdict}{diff} ({result.seconds:.0f}s)")
        results.append(result)
        return result

    for variant in first:
        run(variant)
    # --quick: each feature off in turn tells which one fails; not where stock SGLang
    # fails too (then the model itself does not run as SGLang ships it).
    stock_ok = all(r.ok for r in results if r.variant.name == STOCK)
    if more and (not quick or (stock_ok and not all(r.ok for r in results))):
        for variant in more:
            run(variant)
    elif more:
        why = "the variants above passed" if stock_ok else "stock SGLang fails too"
        for variant in more:
            skipped[variant.name] = f"--quick: {why}"
    if merged is not None:
        merged.cleanup()
    return Report(
        model=model,
        family=family.name if family else None,
        architectures=architectures,
        device=device,
        dtype=dtype,
        tolerance=tolerance,
        features_off=features_off,
        results=results,
        skipped=skipped,
        head=head,
        lora=None if lora is None else str(lora),
    )


LORA_NAME = "verified-adapter"  # the name verify loads an adapter under


@contextlib.contextmanager
def under_adapter(name: str | None):
    """Every engine call made inside runs under the adapter `name` (the calls' context,
    scoring/call_context.py: an Engine call starts from the one carried here)."""
    from prefillonly_sgl.scoring.call_context import carrying, current

    if name is None:
        yield
        return
    with carrying(current().entering(adapter=name)):
        yield


def merge_adapter(model: str, adapter: str, out: str, dtype: str) -> str:
    """`model` with the LoRA adapter `adapter` merged (peft), saved to `out`."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ValueError(
            "verify --lora needs peft (it merges the adapter): pip install peft"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return out


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "verify",
        help="check a model's scores against transformers, feature by feature",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("model", help="a Hugging Face model folder")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", default="float32", help="default float32")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest difference (default 1e-4)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every-feature engines and stock SGLang only; each feature off in turn "
        "only where one of them fails",
    )
    parser.add_argument("--variant", action="append", dest="variants", help="run only these")
    parser.add_argument(
        "--lora",
        metavar="ADAPTER",
        help="a LoRA adapter's folder: every probe runs under it, against the model with it "
        "merged (needs peft)",
    )
    parser.add_argument(
        "--json", metavar="FILE", help="also write the report as JSON ('-': stdout)"
    )
    parser.set_defaults(handler=main)


def main(args) -> int:
    import sys

    progress = (
        (lambda line: print(line, file=sys.stderr, flush=True))
        if args.json == "-"
        else (lambda line: print(line, flush=True))
    )
    try:
        report = verify(
            args.model,
            device=args.device,
            dtype=args.dtype,
            tolerance=args.tolerance,
            quick=args.quick,
            variants=args.variants,
            progress=progress,
            lora=args.lora,
        )
    except (OSError, ValueError) as e:  # no model folder, an unknown variant
        print(f"prefillonly verify: {e}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print()
        print(report.table())
        if args.json:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if report.family is None and report.lora is None:
        _record_or_say_why_not(report, progress, chosen=bool(args.variants))
    return 0 if report.ok else 1


def _record_or_say_why_not(report: Report, progress, chosen: bool) -> None:
    """An architecture outside the table: a passed verify records the configuration (it
    then starts with the features, no opt-in); a failed one records nothing and says which
    variants failed, so the start stays refused; so does one whose variants the user
    chose (--variant: the others did not run)."""
    if report.ok and chosen:
        progress("[verify] not recorded: --variant ran only the variants named")
        return
    if report.ok:
        path = verified_architectures.write_record(
            report.model, report.architectures, report.device, report.dtype,
            _largest_difference(report),
        )  # fmt: skip
        progress(
            f"[verify] recorded: this configuration now starts with the features on, no "
            f"opt-in ({path})"
        )
        return
    failed = [r.variant.name for r in report.judged if not r.ok]
    why = f"failed: {', '.join(failed)}" if failed else "no variant with the features ran"
    progress(
        f"[verify] not recorded ({why}): the features still refuse to start on this "
        "configuration; the table above says what differs"
    )


def _largest_difference(report: Report) -> float | None:
    diffs = [r.max_diff for r in report.results if r.max_diff is not None]
    return max(diffs) if diffs else None
