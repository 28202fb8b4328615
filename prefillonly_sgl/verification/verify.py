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
    images      a vision-language model (a family with image tokens): the items about an
                image (Engine.score(images=)), cold and again from the prefix cache,
                against transformers through the model's own processor
                (verification/image_reference.py)

and compares each with a float32 transformers forward (verification/reference.py),
computed once. The report is the largest difference per probe and variant, and per feature (over the
variants that ran with it), pass / fail at the tolerance. `--quick` starts the
every-feature engines and stock SGLang only, and each feature off in turn only when one
of those fails while stock SGLang passes (to find which).

A model with a classification head is checked by its class logits (cold, cached, long;
the token probes do not apply). `--lora ADAPTER` loads a LoRA adapter in every variant's
engine and runs every probe under it, against transformers with the adapter merged.

This module is the command and its entry point, verify(); its parts are its neighbours:
probes.py (the probes, the reference's answers to them, their checks on one engine),
variants.py (the variants, one engine per variant), merged_lora.py (--lora) and
report.py (the report and its text).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prefillonly_sgl.models import families, verified_architectures
from prefillonly_sgl.verification.merged_lora import LORA_NAME, merge_adapter, under_adapter
from prefillonly_sgl.verification.probes import (
    PROBES,
    SMALL_CHUNK,
    Check,
    Expected,
    Probes,
    image_answers,
    make_probes,
    max_abs_diff,
    probe_image,
    reference_answers,
    run_probes,
    sliding_window_of,
)
from prefillonly_sgl.verification.report import Report
from prefillonly_sgl.verification.variants import (
    STOCK,
    Variant,
    VariantResult,
    VariantRuns,
    plan_variants,
    splits_at_prefix,
)

# What other code and the tests import from here (verify's parts, from their modules).
__all__ = [
    "LORA_NAME",
    "PROBES",
    "SMALL_CHUNK",
    "STOCK",
    "Check",
    "Expected",
    "Probes",
    "Report",
    "Variant",
    "VariantResult",
    "add_parser",
    "main",
    "make_probes",
    "max_abs_diff",
    "merge_adapter",
    "plan_variants",
    "reference_answers",
    "run_probes",
    "sliding_window_of",
    "splits_at_prefix",
    "under_adapter",
    "verify",
]


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
    if family is not None and family.reads_images and not head and lora is None:
        from prefillonly_sgl.verification.image_reference import ImageReference

        probes.image = probe_image()
        expected.images = image_answers(ImageReference(model, dtype=dtype), probes)
    progress(
        f"[verify] transformers reference: {time.perf_counter() - started:.1f}s "
        f"(long prompt {probes.long_tokens} tokens)"
    )

    runs = VariantRuns(
        model=model,
        device=device,
        dtype=dtype,
        architectures=architectures,
        family=family,
        probes=probes,
        expected=expected,
        tolerance=tolerance,
        head=head,
        adapter=LORA_NAME if lora is not None else None,
        engine_args=engine_args or {},
        engines=engines or {},
        progress=progress,
    )
    results = runs.results
    for variant in first:
        runs.run(variant)
    # --quick: each feature off in turn tells which one fails; not where stock SGLang
    # fails too (then the model itself does not run as SGLang ships it).
    stock_ok = all(r.ok for r in results if r.variant.name == STOCK)
    if more and (not quick or (stock_ok and not all(r.ok for r in results))):
        for variant in more:
            runs.run(variant)
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
