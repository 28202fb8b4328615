"""`prefillonly verify`'s report: every variant's result, the largest difference per
feature (over the variants that ran with it; stock SGLang shown as the baseline, not
judged), pass / fail at the tolerance, as the text table the command prints and as JSON
(--json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.verification.probes import PROBES, Check
from prefillonly_sgl.verification.variants import STOCK, VariantResult

NOT_FOR_HEADS = "n/a: a classification head answers its classes, not tokens"
TEXT_ONLY = "n/a: the model reads text only (or its family is not known to read images)"


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
        reads_images = any(
            c.applies for r in self.judged for n, c in r.checks.items() if n == "images"
        )
        rows["images"] = (
            _summarise(self.judged, None, self.tolerance, "images")
            if reads_images
            else {"status": TEXT_ONLY, "max_diff": None}
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
