"""Results out (plain Python): JSONL, CSV or Parquet, durable as rows finish, resumable,
and no output file ever half-written. One resume and errors-file logic for both runners
(Output): what an earlier run of the job left (``done``: its rows, and the rows of its
errors file), starting afresh (``remove``), the errors file.

The local runner's output is one file (ResultWriter). Rows are appended to a journal of
JSON lines, ``<output>.partial.jsonl``, as they finish (flushed and fsynced per write),
each with its input ``row``: that is where a running job's results appear. The output
itself is written from the journal (to a temporary file, renamed into place) when the job
ends, also when it is interrupted or aborted, so it only ever holds whole rows, in row
order. A rerun reads the journal (or, when there is none, a finished output), drops a
last line a kill cut short, and skips the rows already there.

The Ray runner's output is a folder (FolderWriter): each finished bucket is one file of it
(written whole, renamed into place), so the folder is its own journal; a rerun reads it.

Records that could not be scored go to the errors file (``<output>.errors.jsonl``): row,
reason and the record's fields, so a job never stops for one bad record; a rerun does not
retry them (delete the file to retry).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from prefillonly_sgl.batch.sources import file_format
from prefillonly_sgl.scoring.errors import InvalidRequestError

MAX_ERROR_FIELD_CHARS = 200  # a record's fields are echoed into the errors file, cut here


def flatten(result: dict) -> dict:
    """A result as one flat row (CSV/Parquet columns): ``probs`` becomes ``prob_<label>``."""
    flat = {k: v for k, v in result.items() if k != "probs"}
    for label, p in (result.get("probs") or {}).items():
        flat[f"prob_{label}"] = p
    return flat


def rows_for(fmt: str, results: list[dict]) -> list[dict]:
    """Results as rows of an output of format ``fmt``: flat for CSV and Parquet."""
    return results if fmt == "jsonl" else [flatten(r) for r in results]


def errors_path_for(output, errors_file=None) -> Path:
    """The errors file: ``errors_file``, else ``<output>.errors.jsonl`` beside the output
    (a file or a folder), else errors.jsonl here."""
    if errors_file:
        return Path(errors_file)
    if output is None:
        return Path("errors.jsonl")
    return Path(str(output).rstrip("/") + ".errors.jsonl")


class Output:
    """What both runners do with an output and its errors file (a subclass keeps the rows:
    ``_stored_rows``, ``_remove_rows``, ``write``)."""

    def __init__(self, path: Path | None, fmt: str | None, errors_file=None) -> None:
        self.path, self.format = path, fmt
        self.errors_path = errors_path_for(path, errors_file)

    def remove(self) -> None:
        """Forget earlier results and errors (overwrite)."""
        self._remove_rows()
        self.errors_path.unlink(missing_ok=True)

    def done(self) -> tuple[dict[int, dict], set[int]]:
        """(results by row, rows in the errors file) from an earlier run: what a rerun
        skips."""
        return {int(r["row"]): r for r in self._stored_rows()}, error_rows(self.errors_path)

    def write_errors(self, errors: list[tuple[int, str, Any]]) -> None:
        write_errors(self.errors_path, errors)

    def _stored_rows(self) -> list[dict]:
        raise NotImplementedError

    def _remove_rows(self) -> None:
        raise NotImplementedError


class ResultWriter(Output):
    """One output file, journaled (the local runner)."""

    def __init__(self, path: str | Path, fmt: str | None = None, errors_path=None) -> None:
        path = Path(path)
        super().__init__(path, file_format(path, fmt), errors_path)
        self.journal = self.path.with_name(self.path.name + ".partial.jsonl")
        if self.path.parent and not self.path.parent.is_dir():
            raise InvalidRequestError(f"{self.path}: the folder {self.path.parent} does not exist")

    def _remove_rows(self) -> None:
        for p in (self.path, self.journal):
            p.unlink(missing_ok=True)

    def _stored_rows(self) -> list[dict]:
        if self.path.exists() and not self.journal.exists():
            # an output written before: rows may be added to it
            _write_lines(self.journal, read_rows(self.path, self.format), mode="w")
        return _read_journal(self.journal)

    def write(self, results: list[dict]) -> None:
        _write_lines(self.journal, rows_for(self.format, results))

    def finish(self) -> int:
        """Writes the output in row order; returns its number of rows."""
        rows = sorted(_read_journal(self.journal), key=lambda r: r["row"])
        write_rows(self.path, self.format, rows)
        self.journal.unlink(missing_ok=True)
        return len(rows)


class FolderWriter(Output):
    """A folder of files, one per finished bucket (the Ray runner): the folder is its own
    journal. ``reader(folder)`` reads the rows an earlier run wrote (the Ray runner passes
    Ray Data's reader of the format, which types CSV values as the new rows are typed);
    None: no output, nothing kept or resumed."""

    def __init__(self, path: Path | None, fmt: str | None, errors_file=None, reader=None):
        super().__init__(path, fmt or "jsonl", errors_file)
        self.reader = reader
        self.run, self.written = uuid.uuid4().hex[:8], 0  # names no other run's files take

    def prepare(self) -> None:
        """The folder made (a file in its place refused); bucket files a killed driver
        left half-written removed."""
        if self.path is None:
            return
        if self.path.exists() and not self.path.is_dir():
            raise InvalidRequestError(
                f"{self.path} is a file: executor='ray' writes a folder of files (pass "
                "another output, or overwrite=True to replace it)"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        for stale in self.path.glob(".*.tmp"):
            stale.unlink()

    def _remove_rows(self) -> None:
        if self.path is not None and self.path.is_dir():
            shutil.rmtree(self.path)
        elif self.path is not None:
            self.path.unlink(missing_ok=True)

    def _stored_rows(self) -> list[dict]:
        if self.path is None or not self.path.is_dir() or not any(self.path.iterdir()):
            return []
        return self.reader(self.path)

    def write(self, rows: list[dict]) -> None:
        if self.path is None or not rows:
            return
        self.written += 1
        name = f"part-{self.run}-{self.written:05d}.{self.format}"
        write_rows(self.path / name, self.format, rows)


def read_rows(path: Path, fmt: str) -> list[dict]:
    """The rows of one results file of format ``fmt``."""
    if fmt == "jsonl":
        return _read_journal(path)
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            return [{**r, "row": int(r["row"])} for r in csv.DictReader(f)]
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def write_rows(path: Path, fmt: str, rows: list[dict]) -> None:
    """Writes ``rows`` as a whole file of format ``fmt`` at ``path``: to a temporary file
    (``.<name>.tmp``, a suffix no reader takes for a results file) renamed into place once
    flushed, so ``path`` holds all the rows or does not exist."""
    temporary = path.with_name(f".{path.name}.tmp")
    if fmt == "jsonl":
        _write_lines(temporary, rows, mode="w")
    elif fmt == "csv":
        columns = list(dict.fromkeys(k for r in rows for k in r))
        with open(temporary, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), temporary)
    os.replace(temporary, path)


def error_rows(path: Path) -> set[int]:
    """The rows in an errors file (not retried by a rerun)."""
    return {r["row"] for r in _read_journal(path)}


def write_errors(path: Path, errors: list[tuple[int, str, Any]]) -> None:
    """Appends (row, reason, record) lines to an errors file, the record's texts cut."""
    lines = [{"row": r, "reason": reason, "record": _echo(x)} for r, reason, x in errors]
    _write_lines(path, lines)


def _write_lines(path: Path, rows: list[dict], mode: str = "a") -> None:
    if not rows and mode == "a":
        return
    text = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _read_journal(path: Path) -> list[dict]:
    """The complete lines of a journal; a last line a kill cut short is cut off the file
    (JSON escapes newlines, so one line is one row)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    rows = []
    for number, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise InvalidRequestError(
                f"{path}: line {number} is not JSON: not a results file this runner wrote "
                "(pass overwrite=True / --overwrite to replace it)"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("row"), int):
            raise InvalidRequestError(
                f"{path}: line {number} has no row number: not a results file this runner "
                "wrote (pass overwrite=True / --overwrite to replace it)"
            )
        rows.append(row)
    return rows


def _echo(record: Any) -> Any:
    if not isinstance(record, dict):
        return None
    return {
        str(k): v[:MAX_ERROR_FIELD_CHARS] if isinstance(v, str) else v for k, v in record.items()
    }
