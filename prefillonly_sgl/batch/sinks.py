"""Results out (plain Python): JSONL, CSV or Parquet, durable as rows finish, resumable,
and the output file never half-written.

Rows are appended to a journal of JSON lines, ``<output>.partial.jsonl``, as they finish
(flushed and fsynced per write), each with its input ``row``: that is where a running
job's results appear. The output itself is written from the journal (to a temporary file,
renamed into place) when the job ends, also when it is interrupted or aborted, so it only
ever holds whole rows, in row order. A rerun reads the journal (or, when there is none, a
finished output), drops a last line a kill cut short, and skips the rows already there.

Records that could not be scored go to the errors file (``<output>.errors.jsonl``): row,
reason and the record's fields, so a job never stops for one bad record; a rerun does not
retry them (delete the file to retry).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from prefillonly_sgl.batch.sources import file_format
from prefillonly_sgl.errors import InvalidRequestError

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


class ResultWriter:
    def __init__(self, path: str | Path, fmt: str | None = None, errors_path=None) -> None:
        self.path = Path(path)
        self.format = file_format(self.path, fmt)
        self.errors_path = Path(errors_path or f"{self.path}.errors.jsonl")
        self.journal = self.path.with_name(self.path.name + ".partial.jsonl")
        if self.path.parent and not self.path.parent.is_dir():
            raise InvalidRequestError(f"{self.path}: the folder {self.path.parent} does not exist")

    # -- what an earlier run left ---------------------------------------------------------
    def remove(self) -> None:
        """Forget earlier results (overwrite)."""
        for p in {self.path, self.journal, self.errors_path}:
            p.unlink(missing_ok=True)

    def done(self) -> tuple[dict[int, dict], set[int]]:
        """(results by row, rows in the errors file) from an earlier run."""
        if self.path.exists() and not self.journal.exists():
            self._journal_from_output()  # an output written before: rows may be added to it
        results = {r["row"]: r for r in _read_journal(self.journal)}
        return results, error_rows(self.errors_path)

    def _journal_from_output(self) -> None:
        if self.format == "jsonl":
            rows = _read_journal(self.path)
        elif self.format == "csv":
            with open(self.path, newline="", encoding="utf-8") as f:
                rows = [{**r, "row": int(r["row"])} for r in csv.DictReader(f)]
        else:
            import pyarrow.parquet as pq

            rows = pq.read_table(self.path).to_pylist()
        _write_lines(self.journal, rows, mode="w")

    # -- this run --------------------------------------------------------------------------
    def write(self, results: list[dict]) -> None:
        _write_lines(self.journal, rows_for(self.format, results))

    def write_errors(self, errors: list[tuple[int, str, Any]]) -> None:
        write_errors(self.errors_path, errors)

    def finish(self) -> int:
        """Writes the output in row order; returns its number of rows."""
        rows = sorted(_read_journal(self.journal), key=lambda r: r["row"])
        write_rows(self.path, self.format, rows)
        self.journal.unlink(missing_ok=True)
        return len(rows)


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
