"""Batch jobs: a DSL classifier or ranker over records, resumable (issue 14).

    from prefillonly_sgl.batch import run_batch
    report = run_batch(credit_risk, "applicants.csv", "scores.csv", engine=engine)

sources.py reads records (CSV, JSONL, Parquet, DataFrame, iterables), tasks.py turns a
record into the function's arguments and a result row, sinks.py writes results durably
and finds what an earlier run finished, local_runner.py drives it (prefix-ordered chunks, bad
records to the errors file), scoring.py scores one chunk (bisecting refused chunks,
retrying failures; with what else both runners share: record preparation and
BatchReport), ray_runner.py runs the same job on Ray Data (``executor="ray"``, the same
BatchReport back). `prefillonly batch` is cli.py. All plain Python: the scoring goes
through the DSL's backends.
"""

from prefillonly_sgl.batch.local_runner import run_batch
from prefillonly_sgl.batch.scoring import BatchAborted, BatchReport

__all__ = ["BatchAborted", "BatchReport", "run_batch"]
