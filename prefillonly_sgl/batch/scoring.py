"""Scoring one chunk of prepared records, shared by the local and the Ray runner (plain
Python): a chunk the backend refuses as invalid is split in halves until the bad record is
alone (it becomes a row error); any other failure is retried with backoff, then aborts
the job (BatchAborted). BatchReport counts what a run did."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from prefillonly_sgl.batch.tasks import Prepared, Task
from prefillonly_sgl.errors import InvalidRequestError, PrefillOnlyError


class BatchAborted(PrefillOnlyError, RuntimeError):
    """The backend kept failing; the results so far are saved and a rerun resumes."""


@dataclass
class BatchReport:
    output: Path
    errors_file: Path
    records: int = 0  # rows seen in the input
    scored: int = 0  # scored by this run
    skipped: int = 0  # already in the output or the errors file from an earlier run
    errors: int = 0  # reported to the errors file by this run
    calls: int = 0  # calls to the backend (chunks, and the halves of refused chunks)
    prompt_tokens: int = 0  # as the engine / server reported them (0: not reported)
    cached_tokens: int = 0
    seconds: float = 0.0
    error_reasons: list[str] = field(default_factory=list)  # the first few

    @property
    def cache_hit_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def summary(self) -> str:
        return (
            f"{self.scored} scored ({rate_and_hits(self)}), {self.skipped} already done, "
            f"{self.errors} errors ({self.errors_file if self.errors else 'none'}) -> {self.output}"
        )


def rate_and_hits(report) -> str:
    """ "12.3/s, prefix-cache hits 86% of prompt tokens" for a report with scored, seconds
    and cache_hit_share (the local and the Ray runner's)."""
    rate = report.scored / report.seconds if report.seconds > 0 else 0.0
    share = report.cache_hit_share
    hits = "" if share is None else f", prefix-cache hits {share:.0%} of prompt tokens"
    return f"{rate:.1f}/s{hits}"


def score_chunk(task: Task, backend, chunk: list[Prepared], report: BatchReport, retries: int):
    """(results, [(row, reason)]) for a chunk; a refused chunk is split to find the bad
    record(s); other failures are retried, then abort the job."""
    for attempt in range(retries + 1):
        report.calls += 1
        try:
            return task.score(backend, chunk), []
        except InvalidRequestError as e:
            if len(chunk) == 1:
                return [], [(chunk[0].row, str(e))]
            half = len(chunk) // 2
            first = score_chunk(task, backend, chunk[:half], report, retries)
            second = score_chunk(task, backend, chunk[half:], report, retries)
            return first[0] + second[0], first[1] + second[1]
        except BatchAborted:  # a half already used up its retries: do not retry the whole
            raise
        except (PrefillOnlyError, OSError, RuntimeError) as e:
            if attempt == retries:
                raise BatchAborted(
                    f"scoring rows {chunk[0].row}..{chunk[-1].row} failed {retries + 1} times "
                    f"({type(e).__name__}: {e}); {report.scored} rows of this run are saved: "
                    "rerun the same job to resume"
                ) from e
            time.sleep(min(30.0, 2.0**attempt))
    raise AssertionError("unreachable")
