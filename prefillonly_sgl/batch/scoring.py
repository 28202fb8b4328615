"""What the local and the Ray runner share (plain Python): BatchReport, the one report of
a run whatever its executor; preparing records (rows an earlier run finished skipped, bad
records to the errors file); and scoring one chunk of prepared records: a chunk the
backend refuses as invalid is split in halves until the bad record is alone (it becomes a
row error); any other failure is retried with backoff, then aborts the job
(BatchAborted)."""

from __future__ import annotations

import time
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from prefillonly_sgl.batch.sinks import write_errors
from prefillonly_sgl.batch.sources import RecordError
from prefillonly_sgl.batch.tasks import Prepared, Task
from prefillonly_sgl.scoring.errors import InvalidRequestError, PrefillOnlyError


class BatchAborted(PrefillOnlyError, RuntimeError):
    """The backend kept failing; the results so far are saved and a rerun resumes."""


@dataclass
class BatchReport:
    """What a run did; run_batch returns one whatever its executor."""

    output: Path | None  # None: a Ray run asked for no output (its rows in `results` only)
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
    executor: str = "local"  # "local" or "ray"
    # executor="ray" only: the job's result rows (the output's, earlier runs' included) as
    # a ray.data.Dataset in row order. None for "local": its rows are in the output file.
    results: Any = None

    @property
    def cache_hit_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def summary(self) -> str:
        rate = self.scored / self.seconds if self.seconds > 0 else 0.0
        share = self.cache_hit_share
        hits = "" if share is None else f", prefix-cache hits {share:.0%} of prompt tokens"
        where = "" if self.executor == "local" else f" on {self.executor.capitalize()}"
        output = f" -> {self.output}" if self.output is not None else ""
        return (
            f"{self.scored} scored{where} ({rate:.1f}/s{hits}), {self.skipped} already done, "
            f"{self.errors} errors ({self.errors_file if self.errors else 'none'}){output}"
        )


def progress_bar(function, total: int | None, progress: bool) -> tqdm:
    """The job's bar, in records (``total``: None when the input's length is unknown)."""
    name = getattr(function.fn, "__name__", "batch")
    return tqdm(total=total, desc=name, unit="record", disable=not progress)


def prepare_records(
    task: Task, pairs: Iterable[tuple[int, Any]], report: BatchReport, skip: Container[int], bar
) -> Iterator[tuple[Prepared, dict]]:
    """(prepared, record) for each record of ``pairs`` ((row, record) as
    sources.read_records gives them) that is to be scored. Every record is counted into
    ``report``; rows in ``skip`` (finished or failed by an earlier run) are skipped; a
    record that cannot be read or does not hold the function's arguments goes to the
    errors file. ``bar`` (tqdm) advances for each record not yielded."""
    for row, record in pairs:
        report.records += 1
        if row in skip:
            report.skipped += 1
            bar.update(1)
        elif isinstance(record, RecordError):
            report_errors(report, bar, [(row, record.reason, None)])
        else:
            try:
                prepared = task.prepare(row, record)
            except InvalidRequestError as e:
                report_errors(report, bar, [(row, str(e), record)])
                continue
            yield prepared, record


def report_errors(report: BatchReport, bar, errors: list[tuple[int, str, Any]]) -> None:
    """Records that will not be scored, (row, reason, record): appended to the errors
    file, counted, the first few reasons kept."""
    if not errors:
        return
    write_errors(report.errors_file, errors)
    report.errors += len(errors)
    room = max(0, 5 - len(report.error_reasons))
    report.error_reasons += [f"row {row}: {why}" for row, why, _ in errors[:room]]
    bar.update(len(errors))


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
