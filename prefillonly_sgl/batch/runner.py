"""The batch runner: a DSL classifier or ranker over records, results to a file as they
finish, resumable, bad records reported and skipped.

    report = run_batch(credit_risk, "applicants.csv", "scores.jsonl", engine=engine)

Records are read in windows (``window`` records); within a window they are ordered by
their prompt's shared prefix (stable) and sent ``chunk_size`` at a time, so records that
share a prefix go out together and the prefix is computed once. A chunk the backend
refuses as invalid (e.g. a prompt too long) is split in halves until the bad record is
alone, which then goes to the errors file; a chunk that fails otherwise (a server gone) is
retried ``retries`` times, then the job stops with BatchAborted, everything finished so far
saved: a rerun resumes where it stopped (sinks.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from tqdm.auto import tqdm

# BatchAborted and BatchReport are part of this module's API (re-exported).
from prefillonly_sgl.batch.scoring import BatchAborted, BatchReport, score_chunk
from prefillonly_sgl.batch.sinks import ResultWriter
from prefillonly_sgl.batch.sources import (
    RecordError,
    check_source,
    count_records,
    read_records,
)
from prefillonly_sgl.batch.tasks import Prepared, Task, task_for
from prefillonly_sgl.dsl.backends import resolve_backend
from prefillonly_sgl.errors import InvalidRequestError

__all__ = ["BatchAborted", "BatchReport", "run_batch"]

DEFAULT_CHUNK = 64  # records per call to the backend: a smooth progress bar, full batches
DEFAULT_WINDOW = 4096  # records ordered by prefix at a time (memory stays bounded)


def run_batch(
    function,
    records,
    output,
    *,
    engine=None,
    output_format: str | None = None,
    errors_file=None,
    columns: dict | None = None,
    keep=(),
    overwrite: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
    window: int = DEFAULT_WINDOW,
    retries: int = 2,
    progress: bool = True,
    executor: str = "local",
    ray: dict | None = None,
) -> BatchReport:
    """Scores every record with ``function`` (a DSL classifier or ranker) into ``output``.

    records: a CSV / JSONL / Parquet path, a pandas DataFrame, or an iterable of dicts;
        each record's fields are the function's parameters (``columns`` maps a parameter
        to a differently named field; ``keep`` names fields copied into the results).
    output: .jsonl, .csv or .parquet (or ``output_format``); results in row order, each
        with its input ``row`` (from 0). An existing output of the same job is resumed:
        finished rows are never scored again; ``overwrite=True`` starts afresh.
    errors_file: where bad records go (default ``<output>.errors.jsonl``).
    engine: an Engine, a server URL or a Backend (default: ``prefillonly.use``'s); with
        ``executor="ray"``, the keyword arguments of each actor's Engine (a dict).
    executor: "local" (this process) or "ray": the same job on Ray Data with a pool of
        engine actors (ray_runner.run_batch_ray; ``ray``: its options, e.g.
        ``{"replicas": 4, "num_gpus": 1, "address": ...}``); returns its RayBatchResult.
    """
    if executor == "ray":
        if engine is not None and not isinstance(engine, dict):
            raise InvalidRequestError(
                "executor='ray' starts its engines on the cluster: pass engine= as the "
                "Engine's keyword arguments (a dict), not an engine or a URL"
            )
        from prefillonly_sgl.batch.ray_runner import run_batch_ray

        return run_batch_ray(function, records, output, engine=engine, columns=columns,
                             keep=keep, errors_file=errors_file, chunk_size=chunk_size,
                             retries=retries, **(ray or {}))  # fmt: skip
    if executor != "local":
        raise InvalidRequestError(f"executor must be 'local' or 'ray', got {executor!r}")
    if chunk_size < 1 or window < 1 or retries < 0:
        raise InvalidRequestError("chunk_size and window must be >= 1, retries >= 0")
    task = task_for(function, columns, keep)
    check_source(records)
    writer = ResultWriter(output, output_format, errors_file)
    if overwrite:
        writer.remove()
    done, failed = writer.done()
    _check_same_job(task, done, writer.path)
    backend = resolve_backend(engine)
    report = BatchReport(writer.path, writer.errors_path)
    tokens_before = (getattr(backend, "prompt_tokens", 0), getattr(backend, "cached_tokens", 0))
    started = time.perf_counter()
    total = count_records(records)
    name = getattr(function.fn, "__name__", "batch")
    try:
        _run(task, backend, records, writer, report, done, failed, total, name, progress,
             chunk_size, window, retries)  # fmt: skip
    except BaseException:  # Ctrl-C, an abort: the output still gets every finished row
        if writer.journal.exists():
            writer.finish()
        raise
    writer.finish()
    report.seconds = time.perf_counter() - started
    report.prompt_tokens = getattr(backend, "prompt_tokens", 0) - tokens_before[0]
    report.cached_tokens = getattr(backend, "cached_tokens", 0) - tokens_before[1]
    return report


def _run(task, backend, records, writer, report, done, failed, total, name, progress,
         chunk_size, window, retries) -> None:  # fmt: skip
    with tqdm(total=total, desc=name, unit="record", disable=not progress) as bar:
        pending: list[Prepared] = []
        originals: dict[int, dict] = {}
        for row, record in read_records(records):
            report.records += 1
            if row in done or row in failed:
                report.skipped += 1
                bar.update(1)
                continue
            if isinstance(record, RecordError):
                _report_errors(writer, report, bar, [(row, record.reason, None)])
                continue
            try:
                pending.append(task.prepare(row, record))
            except InvalidRequestError as e:
                _report_errors(writer, report, bar, [(row, str(e), record)])
                continue
            originals[row] = record
            if len(pending) >= window:
                _run_window(
                    task, backend, pending, originals, writer, report, bar, chunk_size, retries
                )
                pending, originals = [], {}
        _run_window(task, backend, pending, originals, writer, report, bar, chunk_size, retries)


def _run_window(task, backend, pending, originals, writer, report, bar, chunk_size, retries):
    pending = sorted(pending, key=lambda p: p.prefix)  # stable: same prefix, input order
    for start in range(0, len(pending), chunk_size):
        chunk = pending[start : start + chunk_size]
        results, errors = score_chunk(task, backend, chunk, report, retries)
        writer.write(results)
        report.scored += len(results)
        bar.update(len(results))
        _report_errors(writer, report, bar, [(row, why, originals.get(row)) for row, why in errors])


def _report_errors(writer, report: BatchReport, bar, errors) -> None:
    if not errors:
        return
    writer.write_errors(errors)
    report.errors += len(errors)
    room = max(0, 5 - len(report.error_reasons))
    report.error_reasons += [f"row {row}: {why}" for row, why, _ in errors[:room]]
    bar.update(len(errors))


def _check_same_job(task: Task, done: dict[int, dict], path: Path) -> None:
    """An output being resumed must hold this function's kind of results and labels."""
    if not done:
        return
    sample = next(iter(done.values()))
    expected = "label" if task.kind == "classifier" else "score"
    labels = set(task.function.labels.texts)
    found = set(sample.get("probs") or {}) or {k[5:] for k in sample if k.startswith("prob_")}
    if expected not in sample or found != labels:
        raise InvalidRequestError(
            f"{path} holds results of another job (fields {sorted(sample)[:8]}), not of "
            f"{task.function.fn.__qualname__} (labels {sorted(labels)}): pass overwrite=True "
            "(--overwrite) or another output"
        )
