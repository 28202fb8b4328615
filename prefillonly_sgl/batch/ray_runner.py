"""The batch runner on Ray Data: the same job (a DSL classifier or ranker over records) on a
pool of engine actors, for jobs beyond one machine.

    report = run_batch_ray(credit_risk, "applicants.csv", "scores_parquet/",
                           replicas=4, num_gpus=1, engine={"model_path": "/models/x"})

The driver reads the records (anything ``run_batch`` reads, or a Ray Dataset) and
prepares them exactly as the local runner does (scoring.prepare_records: arguments
validated, bad records to the errors file, each record's prompt prefix, rows an earlier
run finished skipped). Records are then put in buckets by prefix (every record of one
prefix in one bucket; buckets ~``bucket_size`` records), one Ray Data block each, and
``map_batches`` hands whole blocks to an actor pool of ``replicas`` engines
(``concurrency``, each with ``num_cpus`` / ``num_gpus``), each engine started once per
actor. An actor scores its bucket in prefix order, ``chunk_size`` records per call, with
the local runner's bisection of refused chunks, so each prefix is computed once per job,
not once per actor.

Nothing is lost and nothing is done twice:
- an actor that dies (killed, out of memory) loses only the bucket it held: Ray restarts
  it and runs that bucket again (a bucket's rows leave the actor all at once, when it is
  done, so none of them can arrive twice);
- each bucket's rows are written to the output folder as soon as the driver has them, as
  a file of their own (``part-<run>-<n>.<format>``, written to a temporary name and renamed,
  so a file holds a whole bucket or does not exist), and its failed records to the errors
  file: that folder is the job's journal. A driver that dies loses the buckets it had not
  written; a rerun reads the folder and the errors file and scores only the rows in
  neither (``overwrite=True`` starts afresh).

Results: a BatchReport, as the local runner's, whose ``results`` is a Ray Dataset in row
order (the folder's rows from earlier runs and this run's), the local runner's rows for
the folder's format (flat Parquet / CSV, JSON lines with ``probs``).
"""

from __future__ import annotations

import json
import pickle
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

from prefillonly_sgl.batch.scoring import (
    BatchReport,
    prepare_records,
    progress_bar,
    report_errors,
    score_chunk,
)
from prefillonly_sgl.batch.sinks import FolderWriter, rows_for
from prefillonly_sgl.batch.sources import (
    FORMATS,
    check_source,
    count_records,
    file_format,
    read_records,
)
from prefillonly_sgl.batch.tasks import Prepared, task_for
from prefillonly_sgl.dsl.backends import resolve_backend
from prefillonly_sgl.engine import Engine
from prefillonly_sgl.scoring.call_context import cache_salt as salted
from prefillonly_sgl.scoring.errors import InvalidRequestError

DEFAULT_BUCKET = 512  # records per bucket (a Ray Data task's unit of work and retry)
# The options of run_batch_ray that run_batch(executor="ray") takes in its ray= dict.
RAY_OPTIONS = ("replicas", "num_cpus", "num_gpus", "bucket_size", "address")


def bucket_of(prefix: str, buckets: int) -> int:
    """The bucket of a prefix: equal prefixes, equal buckets (stable across processes,
    unlike hash())."""
    return zlib.crc32(prefix.encode()) % buckets


def bucket_count(records: int, replicas: int, bucket_size: int) -> int:
    """Enough buckets to keep every actor busy and each bucket about ``bucket_size``."""
    return max(replicas, -(-records // bucket_size))


class _Scorer:
    """One actor of the pool: an engine started once, scoring whole buckets."""

    def __init__(
        self,
        task_bytes: bytes,
        engine_options: dict,
        chunk_size: int,
        retries: int,
        cache_salt: str | None = None,
    ):
        self.task = pickle.loads(task_bytes)
        self.engine = Engine(**engine_options)
        self.chunk_size, self.retries = chunk_size, retries
        self.cache_salt = cache_salt  # the job's (run_batch's cache_salt)

    def __call__(self, bucket: dict) -> dict:
        """Scores one bucket (a whole block: ``prepared`` records)."""
        prepared = sorted((pickle.loads(b) for b in bucket["prepared"]), key=lambda p: p.prefix)
        backend = resolve_backend(self.engine)
        before = (backend.prompt_tokens, backend.cached_tokens)
        report = BatchReport(None, Path("-"))  # counts the calls only
        rows, kinds, payloads = [], [], []
        for start in range(0, len(prepared), self.chunk_size):
            chunk = prepared[start : start + self.chunk_size]
            with salted(self.cache_salt):
                results, errors = score_chunk(self.task, backend, chunk, report, self.retries)
            for r in results:
                rows.append(r["row"])
                kinds.append("result")
                payloads.append(json.dumps(r, default=str))
            for row, why in errors:  # failures ride along as rows of their own
                rows.append(row)
                kinds.append("error")
                payloads.append(json.dumps({"row": row, "reason": why}))
        # The bucket's tokens and calls on its first row, so the driver can add them up.
        tokens, cached, calls = [0] * len(rows), [0] * len(rows), [0] * len(rows)
        if rows:
            tokens[0] = backend.prompt_tokens - before[0]
            cached[0] = backend.cached_tokens - before[1]
            calls[0] = report.calls
        return {"row": rows, "kind": kinds, "payload": payloads, "prompt_tokens": tokens,
                "cached_tokens": cached, "calls": calls}  # fmt: skip

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def _records_of(records):
    """(row, record) pairs of the usual inputs or of a Ray Dataset (streamed to the driver,
    where preparation runs; the model work runs on the actors)."""
    if _is_dataset(records):
        for row, record in enumerate(records.iter_rows()):
            yield row, dict(record)
        return
    yield from read_records(records)


def _is_dataset(records) -> bool:
    return type(records).__module__.startswith("ray.data")


def _ship_by_value(function) -> None:
    """Ray's workers import a function's module by name; a user's module (a script, a file
    loaded by path as `prefillonly batch FILE.py:NAME` does, a test folder) is not there,
    so it travels by value. Installed packages' modules are imported as usual."""
    from ray import cloudpickle  # Ray stays a lazy import (an optional extra)

    module = sys.modules.get(function.fn.__module__)
    where = str(getattr(module, "__file__", "") or "")
    installed = "site-packages" in where or "dist-packages" in where
    if module is not None and not installed and not module.__name__.startswith("prefillonly_sgl."):
        cloudpickle.register_pickle_by_value(module)


def folder_format(output, given: str | None = None) -> str:
    """The format of an output folder: ``given``, else its suffix (.parquet, .jsonl,
    .csv), else JSON lines when ".json" is in its name, else Parquet."""
    path = Path(output)
    if given is not None or path.suffix.lower() in FORMATS:
        return file_format(path, given)
    return "jsonl" if ".json" in path.name else "parquet"


def run_batch_ray(
    function,
    records,
    output=None,
    *,
    engine: dict | None = None,
    replicas: int = 2,
    num_cpus: float = 1,
    num_gpus: float = 0,
    columns: dict | None = None,
    keep=(),
    errors_file=None,
    output_format: str | None = None,
    overwrite: bool = False,
    chunk_size: int = 64,
    bucket_size: int = DEFAULT_BUCKET,
    retries: int = 2,
    progress: bool = True,
    address: str | None = None,
    cache_salt: str | None = None,
) -> BatchReport:
    """Scores every record with ``function`` on a Ray cluster (``address``; default: the
    one ``ray.init`` finds or starts) with ``replicas`` engine actors.

    engine: keyword arguments of each actor's ``Engine`` (model, device, dtype, ...).
    output: a folder for the results (``output_format``, else ``.parquet`` / ``.jsonl`` /
        ``.csv`` in its name picks the format; default Parquet), a file per bucket as it
        finishes; an earlier run's folder is resumed (``overwrite=True``: started afresh).
        None: not written, nothing resumed (the rows are in the report's ``results``).
    The other arguments mean what they mean for run_batch.
    """
    import ray  # an optional extra: imported when a job runs on it

    if replicas < 1 or chunk_size < 1 or bucket_size < 1 or retries < 0:
        raise InvalidRequestError("replicas, chunk_size and bucket_size must be >= 1, retries >= 0")
    task = task_for(function, columns, keep)
    if not _is_dataset(records):
        check_source(records)
    fmt = folder_format(output, output_format) if output is not None else None
    path = Path(output) if output is not None else None
    files = FolderWriter(
        path, fmt, errors_file, reader=lambda folder: _read_folder(ray, folder, fmt)
    )
    if overwrite or path is None:  # without an output there is nothing to resume
        files.remove()
    files.prepare()
    report = BatchReport(path, files.errors_path, executor="ray")
    started = time.perf_counter()
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    with _ray_data_progress(ray, progress):
        done, failed = files.done()
        task.check_same_job(done, path)
        total = None if _is_dataset(records) else count_records(records)
        with progress_bar(function, total, progress) as bar:
            new_rows = _score(ray, function, task, records, report, done.keys() | failed, bar,
                              files, engine, replicas, num_cpus, num_gpus,
                              chunk_size, bucket_size, retries, cache_salt)  # fmt: skip
    report.results = ray.data.from_items(sorted([*done.values(), *new_rows],
                                                key=lambda r: r["row"]))  # fmt: skip
    report.seconds = time.perf_counter() - started
    return report


def _score(ray, function, task, records, report, skip, bar, files, engine, replicas,
           num_cpus, num_gpus, chunk_size, bucket_size, retries,
           cache_salt=None) -> list[dict]:  # fmt: skip
    """The records prepared on the driver, scored by the actor pool: this run's results
    as rows of the output's format, each bucket's written to ``files`` (and its errors to
    the errors file) as it arrives, tokens and calls counted into ``report``."""
    prepared: list[Prepared] = []
    originals: dict[int, dict] = {}
    for p, record in prepare_records(task, _records_of(records), report, skip, bar):
        prepared.append(p)
        originals[p.row] = record
    if not prepared:
        return []
    _ship_by_value(function)
    from ray import cloudpickle  # the user's module by value, where _ship_by_value said so

    buckets = bucket_count(len(prepared), replicas, bucket_size)
    by_bucket: dict[int, list[bytes]] = {}
    for p in prepared:
        by_bucket.setdefault(bucket_of(p.prefix, buckets), []).append(cloudpickle.dumps(p))
    # One block per bucket, each handed whole to an actor (batch_size=None). The buckets are
    # made here rather than with Ray's groupby: its shuffle needs CPUs of its own beside
    # the actors' (on a cluster the actors fill, it never runs).
    import pyarrow as pa  # with Ray (its dependency)

    blocks = [pa.table({"prepared": pa.array(items, pa.binary())}) for items in by_bucket.values()]
    scored = ray.data.from_arrow(blocks).map_batches(
        _Scorer,
        fn_constructor_args=(
            cloudpickle.dumps(task),
            dict(engine or {}),
            chunk_size,
            retries,
            cache_salt,
        ),
        batch_size=None,
        batch_format="numpy",
        concurrency=replicas,
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        max_task_retries=3,
        max_restarts=3,
    )
    results = []
    # Whole buckets, as they finish (batch_size=None: one block, i.e. one actor call's
    # output, at a time): each is on disk before the next is taken.
    for bucket in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
        out = bucket.to_pydict()
        report.prompt_tokens += sum(out["prompt_tokens"])
        report.cached_tokens += sum(out["cached_tokens"])
        report.calls += sum(out["calls"])
        rows, errors = [], []
        for kind, text in zip(out["kind"], out["payload"], strict=True):
            payload = json.loads(text)
            if kind == "error":
                row = int(payload["row"])
                errors.append((row, payload["reason"], originals.get(row)))
            else:
                rows.append(payload)
        rows = rows_for(files.format, sorted(rows, key=lambda r: r["row"]))
        files.write(rows)  # the results first: a kill between the two rescores the errors
        report_errors(report, bar, errors)
        results += rows
        report.scored += len(rows)
        bar.update(len(rows))
    return sorted(results, key=lambda r: r["row"])


@contextmanager
def _ray_data_progress(ray, progress: bool):
    """Ray Data's own progress bars off for the job when ``progress`` is False."""
    context = ray.data.DataContext.get_current()
    before = context.enable_progress_bars
    context.enable_progress_bars = before and progress
    try:
        yield
    finally:
        context.enable_progress_bars = before


def _read_folder(ray, folder: Path, fmt: str) -> list[dict]:
    """The rows an earlier run wrote to the output folder (Ray Data's reader of the format:
    CSV values typed as the new rows are)."""
    read = {"parquet": ray.data.read_parquet, "jsonl": ray.data.read_json,
            "csv": ray.data.read_csv}[fmt]  # fmt: skip
    return read(str(folder)).take_all()
