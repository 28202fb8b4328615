"""The batch runner: a DSL classifier or ranker over records, results to a file as they
finish, resumable, bad records reported and skipped.

    report = run_batch(credit_risk, "applicants.csv", "scores.jsonl", engine=engine)

Records are read in windows (``window`` records); within a window they are ordered by
their prompt's shared prefix (stable) and sent ``chunk_size`` at a time, so records that
share a prefix go out together and the prefix is computed once. A chunk the backend
refuses as invalid (e.g. a prompt too long) is split in halves until the bad record is
alone, which then goes to the errors file; a chunk that fails otherwise (a server gone) is
retried ``retries`` times, then the job stops with BatchAborted, everything finished so far
saved: a rerun resumes where it stopped (sinks.py). ``executor="ray"`` runs the same job
on Ray Data (ray_runner.py) and returns the same BatchReport.
"""

from __future__ import annotations

import time

from prefillonly_sgl.batch.ray_runner import RAY_OPTIONS, run_batch_ray

# BatchAborted and BatchReport are part of this module's API (re-exported).
from prefillonly_sgl.batch.scoring import (
    BatchAborted,
    BatchReport,
    prepare_records,
    progress_bar,
    report_errors,
    score_chunk,
)
from prefillonly_sgl.batch.sinks import ResultWriter
from prefillonly_sgl.batch.sources import check_source, count_records, read_records
from prefillonly_sgl.batch.tasks import Prepared, task_for
from prefillonly_sgl.dsl.backends import resolve_backend
from prefillonly_sgl.scoring.call_context import cache_salt as salted
from prefillonly_sgl.scoring.errors import InvalidRequestError

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
    window: int | None = None,
    retries: int = 2,
    progress: bool = True,
    executor: str = "local",
    ray: dict | None = None,
    cache_salt: str | None = None,
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
    window: records ordered by prefix at a time (default 4096); local only.
    executor: "local" (this process) or "ray": the same job on Ray Data with a pool of
        engine actors (ray_runner.run_batch_ray; ``ray``: its options, e.g.
        ``{"replicas": 4, "num_gpus": 1, "address": ...}``); output is then a folder of
        files (None: results only in the report's ``results`` Dataset).
    cache_salt: the job's prefix-cache namespace: its calls reuse only prefixes cached
        under the same salt (docs/server.md, "Tenants"); the scores are the same.
    Returns a BatchReport whatever the executor.
    """
    if executor == "ray":
        _check_ray_arguments(engine, window, ray)
        return run_batch_ray(function, records, output, engine=engine,
                             output_format=output_format, errors_file=errors_file,
                             columns=columns, keep=keep, overwrite=overwrite,
                             chunk_size=chunk_size, retries=retries, progress=progress,
                             cache_salt=cache_salt, **(ray or {}))  # fmt: skip
    if executor != "local":
        raise InvalidRequestError(f"executor must be 'local' or 'ray', got {executor!r}")
    if ray is not None:
        raise InvalidRequestError("ray= holds the options of executor='ray'; this job is local")
    if output is None:
        raise InvalidRequestError(
            "output: the local runner writes its results to a file (a Dataset without an "
            "output is executor='ray''s)"
        )
    window = DEFAULT_WINDOW if window is None else window
    if chunk_size < 1 or window < 1 or retries < 0:
        raise InvalidRequestError("chunk_size and window must be >= 1, retries >= 0")
    task = task_for(function, columns, keep)
    check_source(records)
    writer = ResultWriter(output, output_format, errors_file)
    if overwrite:
        writer.remove()
    done, failed = writer.done()
    task.check_same_job(done, writer.path)
    backend = resolve_backend(engine)
    report = BatchReport(writer.path, writer.errors_path)
    tokens_before = (getattr(backend, "prompt_tokens", 0), getattr(backend, "cached_tokens", 0))
    started = time.perf_counter()
    try:
        with salted(cache_salt), progress_bar(function, count_records(records), progress) as bar:
            pending: list[Prepared] = []
            originals: dict[int, dict] = {}
            for prepared, record in prepare_records(
                task, read_records(records), report, done.keys() | failed, bar
            ):
                pending.append(prepared)
                originals[prepared.row] = record
                if len(pending) >= window:
                    _run_window(task, backend, pending, originals, writer, report, bar,
                                chunk_size, retries)  # fmt: skip
                    pending, originals = [], {}
            _run_window(task, backend, pending, originals, writer, report, bar, chunk_size,
                        retries)  # fmt: skip
    except BaseException:  # Ctrl-C, an abort: the output still gets every finished row
        if writer.journal.exists():
            writer.finish()
        raise
    writer.finish()
    report.seconds = time.perf_counter() - started
    report.prompt_tokens = getattr(backend, "prompt_tokens", 0) - tokens_before[0]
    report.cached_tokens = getattr(backend, "cached_tokens", 0) - tokens_before[1]
    return report


def _check_ray_arguments(engine, window, ray) -> None:
    """What executor='ray' cannot take, refused by name rather than dropped."""
    if engine is not None and not isinstance(engine, dict):
        raise InvalidRequestError(
            "executor='ray' starts its engines on the cluster: pass engine= as the "
            "Engine's keyword arguments (a dict), not an engine or a URL"
        )
    if window is not None:
        raise InvalidRequestError(
            "window= bounds the local runner's prefix ordering; executor='ray' orders the "
            "whole job by prefix (its buckets, ray={'bucket_size': ...}): drop window="
        )
    unknown = sorted(set(ray or {}) - set(RAY_OPTIONS))
    if unknown:
        raise InvalidRequestError(f"ray=: unknown option(s) {unknown}; known: {RAY_OPTIONS}")


def _run_window(task, backend, pending, originals, writer, report, bar, chunk_size, retries):
    pending = sorted(pending, key=lambda p: p.prefix)  # stable: same prefix, input order
    for start in range(0, len(pending), chunk_size):
        chunk = pending[start : start + chunk_size]
        results, errors = score_chunk(task, backend, chunk, report, retries)
        writer.write(results)
        report.scored += len(results)
        bar.update(len(results))
        report_errors(report, bar, [(row, why, originals.get(row)) for row, why in errors])
