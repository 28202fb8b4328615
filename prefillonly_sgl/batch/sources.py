"""Records in (plain Python): a CSV, JSONL or Parquet file, a pandas DataFrame, or any
iterable of dicts, read lazily as (row number, record) pairs.

A record that cannot be read (a JSONL line that is not a JSON object, an iterable's item
that is not a dict) comes out as a RecordError for its row, so the job reports it and
goes on; a source that cannot be opened at all raises InvalidRequestError.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefillonly_sgl.scoring.errors import InvalidRequestError

FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class RecordError:
    """A row that could not be read or scored, and why."""

    row: int
    reason: str


def file_format(path: str | Path, given: str | None = None) -> str:
    """The format of a records or results file: `given`, else from its suffix."""
    if given is not None:
        if given not in set(FORMATS.values()):
            raise InvalidRequestError(
                f"unknown format {given!r}: expected one of {sorted(set(FORMATS.values()))}"
            )
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InvalidRequestError(
            f"{path}: cannot tell the format from the suffix {suffix or '(none)'!r}: "
            f"use one of {', '.join(FORMATS)} or pass the format"
        )
    return FORMATS[suffix]


def check_source(source: Any) -> None:
    """Raises InvalidRequestError for a source that cannot be read at all (before a job
    creates any file)."""
    if isinstance(source, str | Path):
        if not Path(source).is_file():
            raise InvalidRequestError(f"{source}: no such records file")
        file_format(source)
    elif isinstance(source, dict) or not (_is_dataframe(source) or isinstance(source, Iterable)):
        raise InvalidRequestError(
            "records must be a CSV/JSONL/Parquet path, a pandas DataFrame or an iterable of "
            f"dicts, got {type(source).__name__}"
        )


def count_records(source: Any) -> int | None:
    """How many records a source holds when that is cheap to know (for the progress bar's
    ETA); None otherwise."""
    if hasattr(source, "__len__") and not isinstance(source, str | Path):
        return len(source)
    if isinstance(source, str | Path):
        path = Path(source)
        fmt = file_format(path)
        if fmt == "parquet":
            return _pyarrow_parquet().ParquetFile(path).metadata.num_rows
        if fmt == "csv":  # a quoted cell may hold newlines: count records, less the header
            with open(path, newline="", encoding="utf-8") as f:
                return max(0, sum(1 for _ in csv.reader(f)) - 1)
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    return None


def read_records(source: Any) -> Iterator[tuple[int, dict | RecordError]]:
    """(row, record) for every record of `source`, row numbers from 0 in source order."""
    check_source(source)
    if isinstance(source, str | Path):
        path = Path(source)
        reader = {"csv": _csv, "jsonl": _jsonl, "parquet": _parquet}[file_format(path)]
        for row, record in enumerate(reader(path)):
            if isinstance(record, RecordError):
                record = RecordError(row, record.reason)
            yield row, record
        return
    if _is_dataframe(source):
        columns = [str(c) for c in source.columns]
        for row, values in enumerate(source.itertuples(index=False, name=None)):
            yield row, {c: _plain(v) for c, v in zip(columns, values)}
        return
    for row, record in enumerate(source):
        if isinstance(record, dict):
            yield row, record
        else:
            yield row, RecordError(row, f"not a dict of fields: {type(record).__name__}")


def _csv(path: Path) -> Iterator[dict | RecordError]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return
        for record in reader:
            if None in record:  # more cells than the header has columns
                yield RecordError(-1, f"{len(record[None])} cells more than the header names")
            else:
                # An empty cell is a missing value, as pandas reads it.
                yield {k: (None if v == "" else v) for k, v in record.items()}


def _jsonl(path: Path) -> Iterator[dict | RecordError]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                yield RecordError(-1, f"not JSON: {e.msg} at column {e.colno}")
                continue
            if isinstance(record, dict):
                yield record
            else:
                yield RecordError(-1, f"not a JSON object: {type(record).__name__}")


def _parquet(path: Path) -> Iterator[dict]:
    table = _pyarrow_parquet().ParquetFile(path)
    for batch in table.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidRequestError(
            "Parquet needs pyarrow: pip install 'prefillonly-sgl[batch]'"
        ) from None
    return pq


def _is_dataframe(source: Any) -> bool:
    return type(source).__name__ == "DataFrame" and hasattr(source, "itertuples")


def _plain(value: Any) -> Any:
    """A DataFrame cell as a plain Python value: NaN is missing, numpy scalars unwrapped."""
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value
