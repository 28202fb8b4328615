"""The batch runner on Ray Data: the same job (a DSL classifier or ranker over records) on a
pool of engine actors, for jobs beyond one machine.

    report = run_batch_ray(credit_risk, "applicants.csv", "scores_parquet/",
                           replicas=4, num_gpus=1, engine={"model_path": "/models/x"})

The driver reads the records (anything ``run_batch`` reads, or a Ray Dataset) and
prepares them exactly as the local runner does (arguments validated, bad records to the
errors file, each record's prompt prefix). Records are then put in buckets by prefix
(every record of one prefix in one bucket; buckets ~``bucket_size`` records), one Ray
Data block each, and ``map_batches`` hands whole blocks to an actor pool of
``replicas`` engines (``concurrency``, each with ``num_cpus`` / ``num_gpus``), each
engine started once per actor. An actor scores its bucket in prefix order, ``chunk_size``
records per call, with the local runner's bisection of refused chunks, so each prefix is
computed once per job, not once per actor. A task that fails (an actor died) is retried
by Ray; finished buckets are not scored again.

Results: a Ray Dataset in row order (``RayBatchResult.results``, the local runner's
fields), written with Ray Data's writers when ``output`` is given (a folder: .parquet /
.jsonl files); errors, row by row, to ``<output>.errors.jsonl`` (or ``errors_file``).
"""

from __future__ import annotations

import json
import pickle
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefillonly_sgl.batch.sinks import write_errors
from prefillonly_sgl.batch.sources import RecordError, check_source, read_records
from prefillonly_sgl.batch.tasks import Prepared, task_for
from prefillonly_sgl.errors import InvalidRequestError

DEFAULT_BUCKET = 512  # records per bucket (a Ray Data task's unit of work and retry)


@dataclass
class RayBatchResult:
    results: Any  # ray.data.Dataset of result rows, in row order
    errors: list[dict]  # {"row", "reason", "record"} of the records that were not scored
    records: int
    scored: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    output: Path | None = None
    errors_file: Path | None = None

    @property
    def cache_hit_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def summary(self) -> str:
        from prefillonly_sgl.batch.scoring import rate_and_hits

        where = f" -> {self.output}" if self.output else ""
        return (
            f"{self.scored} scored on Ray ({rate_and_hits(self)}), {len(self.errors)} errors{where}"
        )


def bucket_of(prefix: str, buckets: int) -> int:
    """The bucket of a prefix: equal prefixes, equal buckets (stable across processes,
    unlike hash())."""
    return zlib.crc32(prefix.encode()) % buckets


def bucket_count(records: int, replicas: int, bucket_size: int) -> int:
    """Enough buckets to keep every actor busy and each bucket about ``bucket_size``."""
    return max(replicas, -(-records // bucket_size))


class _Scorer:
    """One actor of the pool: an engine started once, scoring whole buckets."""

    def __init__(self, task_bytes: bytes, engine_options: dict, chunk_size: int, retries: int):
        from prefillonly_sgl.engine import Engine

        self.task = pickle.loads(task_bytes)
        self.engine = Engine(**engine_options)
        self.chunk_size, self.retries = chunk_size, retries

    def __call__(self, bucket: dict) -> dict:
        """Scores one bucket (a whole block: ``prepared`` records)."""
        from prefillonly_sgl.batch.scoring import BatchReport, score_chunk
        from prefillonly_sgl.dsl.backends import resolve_backend

        prepared = sorted((pickle.loads(b) for b in bucket["prepared"]), key=lambda p: p.prefix)
        backend = resolve_backend(self.engine)
        before = (backend.prompt_tokens, backend.cached_tokens)
        report = BatchReport(Path("-"), Path("-"))
        rows, kinds, payloads = [], [], []
        for start in range(0, len(prepared), self.chunk_size):
            chunk = prepared[start : start + self.chunk_size]
            results, errors = score_chunk(self.task, backend, chunk, report, self.retries)
            for r in results:
                rows.append(r["row"])
                kinds.append("result")
                payloads.append(json.dumps(r, default=str))
            for row, why in errors:  # failures ride along as rows of their own
                rows.append(row)
                kinds.append("error")
                payloads.append(json.dumps({"row": row, "reason": why}))
        # The tokens of the whole bucket on its first row, so the driver can add them up.
        tokens, cached = [0] * len(rows), [0] * len(rows)
        if rows:
            tokens[0] = backend.prompt_tokens - before[0]
            cached[0] = backend.cached_tokens - before[1]
        return {"row": rows, "kind": kinds, "payload": payloads, "prompt_tokens": tokens,
                "cached_tokens": cached}  # fmt: skip

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def _records_of(records):
    """(row, record) pairs of the usual inputs or of a Ray Dataset (streamed to the driver,
    where preparation runs; the model work runs on the actors)."""
    if type(records).__module__.startswith("ray.data"):
        for row, record in enumerate(records.iter_rows()):
            yield row, dict(record)
        return
    check_source(records)
    yield from read_records(records)


def _ship_by_value(function) -> None:
    """Ray's workers import a function's module by name; a user's module (a script, a file
    loaded by path as `prefillonly batch FILE.py:NAME` does, a test folder) is not there,
    so it travels by value. Installed packages' modules are imported as usual."""
    import sys

    from ray import cloudpickle

    module = sys.modules.get(function.fn.__module__)
    where = str(getattr(module, "__file__", "") or "")
    installed = "site-packages" in where or "dist-packages" in where
    if module is not None and not installed and not module.__name__.startswith("prefillonly_sgl."):
        cloudpickle.register_pickle_by_value(module)


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
    chunk_size: int = 64,
    bucket_size: int = DEFAULT_BUCKET,
    retries: int = 2,
    address: str | None = None,
) -> RayBatchResult:
    """Scores every record with ``function`` on a Ray cluster (``address``; default: the
    one ``ray.init`` finds or starts) with ``replicas`` engine actors.

    engine: keyword arguments of each actor's ``Engine`` (model, device, dtype, ...).
    output: a folder for the results (``.parquet`` or ``.jsonl`` in its name picks the
        format; default Parquet), written with Ray Data's writers; None: not written.
    """
    import ray

    if replicas < 1 or chunk_size < 1 or bucket_size < 1:
        raise InvalidRequestError("replicas, chunk_size and bucket_size must be >= 1")
    task = task_for(function, columns, keep)
    started = time.perf_counter()
    prepared: list[Prepared] = []
    errors: list[dict] = []
    originals: dict[int, Any] = {}
    count = 0
    for row, record in _records_of(records):
        count += 1
        if isinstance(record, RecordError):
            errors.append({"row": row, "reason": record.reason, "record": None})
            continue
        try:
            prepared.append(task.prepare(row, record))
            originals[row] = record
        except InvalidRequestError as e:
            errors.append({"row": row, "reason": str(e), "record": record})
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    _ship_by_value(function)

    from ray import cloudpickle  # the user's module by value, where _ship_by_value said so

    buckets = bucket_count(len(prepared), replicas, bucket_size)
    by_bucket: dict[int, list[bytes]] = {}
    for p in prepared:
        by_bucket.setdefault(bucket_of(p.prefix, buckets), []).append(cloudpickle.dumps(p))
    scored_rows = []
    prompt_tokens = cached_tokens = 0
    if by_bucket:
        # One block per bucket, each handed whole to an actor (batch_size=None). The
        # buckets are made here rather than with Ray's groupby: its shuffle needs CPUs of
        # its own beside the actors' (on a cluster the actors fill, it never runs).
        import pyarrow as pa

        blocks = [pa.table({"prepared": pa.array(items, pa.binary())})
                  for items in by_bucket.values()]  # fmt: skip
        scored = (
            ray.data.from_arrow(blocks)
            .map_batches(
                _Scorer,
                fn_constructor_args=(
                    cloudpickle.dumps(task),
                    dict(engine or {}),
                    chunk_size,
                    retries,
                ),  # fmt: skip
                batch_size=None,
                batch_format="numpy",
                concurrency=replicas,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                max_task_retries=3,
                max_restarts=3,
            )
            .materialize()
        )
        for out in scored.iter_rows():
            prompt_tokens += int(out["prompt_tokens"])
            cached_tokens += int(out["cached_tokens"])
            payload = json.loads(out["payload"])
            if out["kind"] == "error":
                row = int(payload["row"])
                errors.append({"row": row, "reason": payload["reason"],
                               "record": originals.get(row)})  # fmt: skip
            else:
                scored_rows.append(payload)
    scored_rows.sort(key=lambda r: r["row"])
    errors.sort(key=lambda e: e["row"])
    results = ray.data.from_items(scored_rows)
    out_path = _write(results, output) if output is not None and scored_rows else None
    errors_path = None
    if errors:
        errors_path = Path(errors_file) if errors_file else _errors_path(output)
        errors_path.unlink(missing_ok=True)  # this run's errors only (no resume on Ray)
        write_errors(errors_path, [(e["row"], e["reason"], e["record"]) for e in errors])
    return RayBatchResult(results, errors, count, len(scored_rows), prompt_tokens,
                          cached_tokens, time.perf_counter() - started, out_path,
                          errors_path)  # fmt: skip


def _write(results, output) -> Path:
    path = Path(output)
    if ".jsonl" in path.name or ".json" in path.name:
        results.write_json(str(path))
    else:
        results.write_parquet(str(path))
    return path


def _errors_path(output) -> Path:
    if output is None:
        return Path("errors.jsonl")
    return Path(str(output).rstrip("/") + ".errors.jsonl")
