"""docs/models.md's family table, measured: builds each tiny family
(prefillonly_sgl/models/tiny_family_checkpoints.py), runs `prefillonly verify --quick` on it (one
process per family: SGLang ends a process whose engine's worker failed) and writes the
table between the markers in docs/models.md.

    .venv/bin/python scripts/family_table.py                     # every family (~30 min, 2 cores)
    .venv/bin/python scripts/family_table.py --families gpt_oss qwen3_5   # re-measure some
    .venv/bin/python scripts/family_table.py --from-json         # rewrite from saved reports

Reports are kept per family (--json-dir, default build/family_table/), so re-measuring a
few families keeps the others' rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prefillonly_sgl.models.families import FAMILIES, LAYER_KINDS, family_of, read_architectures  # noqa: E402
from prefillonly_sgl.models.tiny_family_checkpoints import FAMILY_BUILDERS  # noqa: E402

DOC = ROOT / "docs" / "models.md"
BEGIN = "<!-- family-table:begin (scripts/family_table.py writes this) -->"
END = "<!-- family-table:end -->"
KINDS_BEGIN = "<!-- kinds-table:begin (scripts/family_table.py writes this) -->"
KINDS_END = "<!-- kinds-table:end -->"
COLUMNS = [
    ("prefill_attention", "prefill-only attention"),
    ("prefill_kv", "prefill-only KV"),
    ("hybrid_prefill:layer", "hybrid layer mode"),
    ("hybrid_prefill:token", "hybrid token mode"),
    ("jct_scheduler", "JCT scheduling"),
    ("prompt_logprobs", "prompt logprobs"),
    ("several-token labels", "several-token labels"),
    ("decisions", "decisions"),
    ("stock SGLang", "stock SGLang (baseline)"),
]


def measure(name: str, json_dir: Path, timeout: int) -> dict:
    """One family's verify report (or a failure record), saved to json_dir/NAME.json."""
    out = json_dir / f"{name}.json"
    with tempfile.TemporaryDirectory() as tmp:
        folder = FAMILY_BUILDERS[name](Path(tmp) / name, 0)
        started = time.perf_counter()
        command = [
            sys.executable, "-m", "prefillonly_sgl", "verify", str(folder),
            "--quick", "--json", str(out),
        ]  # fmt: skip
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        out.unlink(missing_ok=True)
        try:
            proc = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=timeout
            )
            log = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            log = f"{e.stdout or ''}{e.stderr or ''}\nTimeoutExpired: verify ran {timeout}s"
        (json_dir / f"{name}.log").write_text(log)
        if out.exists():
            report = json.loads(out.read_text())
        else:  # verify itself failed: its last line says why
            lines = [line for line in log.strip().splitlines() if line.strip()]
            report = {"error": lines[-1] if lines else "verify wrote no report"}
        report.setdefault("architectures", read_architectures(folder))
        report["seconds"] = round(time.perf_counter() - started, 1)
        report["tiny"] = name
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"   {'ok' if report.get('ok') else 'FAIL'} ({report['seconds']:.0f}s)", flush=True)
        return report


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(reports: dict[str, dict]) -> str:
    notes: dict[str, str] = {}  # reason -> its footnote mark

    def mark(reason: str) -> str:
        if reason not in notes:
            notes[reason] = f"[{len(notes) + 1}]"
        return notes[reason]

    head = [
        "tiny checkpoint",
        "architecture",
        "kinds of layer",
        "classification heads (docs/heads.md)",
        *[title for _, title in COLUMNS],
        "max diff",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in FAMILY_BUILDERS:
        report = reports.get(name)
        if report is None:
            continue
        arch = ", ".join(report.get("architectures") or []) or "?"
        family = family_of(report.get("architectures") or [])
        arch += " | " + (", ".join(family.layers) if family else "?")
        arch += " | " + (", ".join(family.heads) if family and family.heads else "-")
        if "features" not in report:
            cells = ["FAIL " + mark(_short(report.get("error", "no report")))] * len(COLUMNS)
            lines.append(f"| {name} | {arch} | " + " | ".join(cells) + " | |")
            continue
        cells = []
        for key, _ in COLUMNS:
            row = report["features"].get(key, {"status": "not run"})
            status = row["status"]
            if status == "pass":
                cells.append("pass")
            elif status.startswith("off: "):
                cells.append("off " + mark(_short(status[5:], 200)))
            elif status == "not run":
                cells.append("-")
            else:
                cells.append("FAIL " + mark(_short(status.removeprefix("FAIL: ") or "fails", 300)))
        diffs = [v["checks"] for v in report["variants"]]
        worst = max(
            (c["max_diff"] for checks in diffs for c in checks.values() if c["max_diff"]),
            default=None,
        )
        lines.append(
            f"| {name} | {arch} | "
            + " | ".join(cells)
            + f" | {'' if worst is None else f'{worst:.1e}'} |"
        )
    lines.append("")
    for reason, note in notes.items():
        lines.append(f"{note} {reason}  ")
    return "\n".join(lines).rstrip() + "\n"


def kinds_table() -> str:
    """The registry's kinds of layer: the families made of each, what they cannot run."""
    lines = [
        "| kind of layer | families | what the features do with it |",
        "|---|---|---|",
    ]
    for kind in LAYER_KINDS.values():
        users = [f.title for f in FAMILIES.values() if kind.name in f.layers]
        effects = [f"{key} off: {why}" for key, why in kind.off.items()] + list(kind.notes)
        cell = "; ".join(_short(e, 400) for e in effects) or "every feature"
        lines.append(f"| `{kind.name}`: {kind.summary} | {', '.join(users) or '-'} | {cell} |")
    return "\n".join(lines) + "\n"


def _between(doc: str, begin: str, end: str, text: str) -> str:
    start, stop = doc.index(begin) + len(begin), doc.index(end)
    return doc[:start] + "\n" + text + doc[stop:]


def write_doc(text: str) -> None:
    doc = _between(DOC.read_text(), BEGIN, END, text)
    DOC.write_text(_between(doc, KINDS_BEGIN, KINDS_END, kinds_table()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", choices=list(FAMILY_BUILDERS))
    parser.add_argument("--json-dir", default=str(ROOT / "build" / "family_table"))
    parser.add_argument("--from-json", action="store_true", help="only rewrite the table")
    parser.add_argument("--timeout", type=int, default=1800, help="per family, seconds")
    args = parser.parse_args()
    json_dir = Path(args.json_dir)
    json_dir.mkdir(parents=True, exist_ok=True)
    if not args.from_json:
        for name in args.families or list(FAMILY_BUILDERS):
            measure(name, json_dir, args.timeout)
    reports = {}
    for name in FAMILY_BUILDERS:
        path = json_dir / f"{name}.json"
        if path.exists():
            reports[name] = json.loads(path.read_text())
    # Every family of the registry has a tiny checkpoint (and so a row).
    missing = [f for f in FAMILIES if f not in FAMILY_BUILDERS]
    if missing:
        print(f"families without a tiny checkpoint: {missing}", file=sys.stderr)
    for report in reports.values():
        family = family_of(report.get("architectures") or [])
        report.setdefault("family", family.name if family else None)
    write_doc(table(reports))
    print(f"wrote {DOC.relative_to(ROOT)} ({len(reports)} families)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
