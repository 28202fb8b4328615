"""The card checks that never ran on a card, as side jobs of the engine call (issue 83,
item 7): benchmarks/gpu_checks.py (a classification head, LoRA adapters per request,
gpt-oss's attention sinks through our FlashInfer backend: each check in a process of its
own, all at once, against float32 transformers) and tests/test_flashinfer_query_chunk.py
(FlashInfer's query-chunk attention against a naive one; its CUDA cases skip off CUDA).

They start with the engines (while the engines start up, the card is idle) and end, or
are killed at their limit (--checks-limit), before the first timed part: an engine of
theirs beside a measured one would share the card. Their results go beside the engine's:
checks.json and checks.md (gpu_checks.py's results), query_chunk_test.txt (pytest's
output); their logs into diagnostics.tar.gz. LoRA's two adapters come from
build/gpu_checks (`gpu_checks.py --prepare build/gpu_checks` here, carried with the kit);
without them gpu_checks.py writes them where peft imports (the card's image has it)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from harness.process_group import end_group, start_in_group

ROOT = Path(__file__).resolve().parents[2]
QUERY_CHUNK_TEST = "tests/test_flashinfer_query_chunk.py"


class SideChecks:
    """The side jobs of one call: started at once, waited for (or killed) once."""

    def __init__(self, args, log) -> None:
        self.folder = args.work / "side"
        if self.folder.exists():  # an earlier call's on the same machine
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True)
        self.limit = args.checks_limit
        self.started = time.time()
        self.done = False
        self.codes: dict[str, int | None] = {}
        checks = [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_checks.py"),
            "--device",
            args.device,
            "--out",
            str(self.folder / "checks"),
            "--parallel",
            # each check's own limit, inside the job's
            "--limit",
            str(max(10.0, self.limit - 10)),
        ]
        pytest = [sys.executable, "-m", "pytest", QUERY_CHUNK_TEST, "-q", "-rA"]
        # the test alone: no conftest (the suite's servers), no options of the suite's
        pytest += ["--noconftest", "-p", "no:cacheprovider", "-o", "addopts="]
        self.jobs = {}
        for name, command in (("checks", checks), ("query_chunk_test", pytest)):
            output = (self.folder / f"{name}.txt").open("w")
            self.jobs[name] = (start_in_group(command, output, cwd=ROOT), output)
        log(f"card checks started (gpu_checks.py, {QUERY_CHUNK_TEST}): {self.limit:.0f} s at most")

    def wait(self, log) -> bool:
        """Waits for every job (each killed at the limit); False if it had nothing to do."""
        if self.done:
            return False
        for name, (child, output) in self.jobs.items():
            self.codes[name] = end_group(child, self.started + self.limit - time.time())
            output.close()
        self.done = True
        self.seconds = time.time() - self.started
        log(f"card checks ended after {self.seconds:.0f} s: {self.codes}")
        return True

    def collect(self, out: Path) -> dict:
        """The jobs' results into `out` (checks.json, checks.md, query_chunk_test.txt);
        their summary for results.json."""
        out.mkdir(parents=True, exist_ok=True)
        summary: dict = {"seconds": round(getattr(self, "seconds", 0.0), 1), "limit_s": self.limit}
        checks = self.folder / "checks"
        data = _read(checks / "results.json")
        if data is not None:
            shutil.copy(checks / "results.json", out / "checks.json")
            if (checks / "results.md").exists():
                shutil.copy(checks / "results.md", out / "checks.md")
            summary["checks"] = {
                name: {
                    "ok": bool(entry.get("ok")),
                    "seconds": entry.get("seconds"),
                    **({"error": str(entry["error"])[-400:]} if entry.get("error") else {}),
                }
                for name, entry in data.get("checks", {}).items()
            }
        code = self.codes.get("checks", "not waited")
        summary["checks_exit"] = "killed at the limit" if code is None else code
        text = (self.folder / "query_chunk_test.txt").read_text(errors="replace")
        shutil.copy(self.folder / "query_chunk_test.txt", out / "query_chunk_test.txt")
        code = self.codes.get("query_chunk_test", "not waited")
        summary["query_chunk_test"] = {
            "exit": "killed at the limit" if code is None else code,
            "summary": _last_line(text),
        }
        return summary


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
