"""The batch runner's plain parts (no engine): reading records from every input format,
bad records as row errors, the journal a kill cuts short, and the final output in row
order in every output format."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from prefillonly_sgl.batch.sinks import ResultWriter, flatten
from prefillonly_sgl.batch.sources import RecordError, count_records, read_records
from prefillonly_sgl.scoring.errors import InvalidRequestError

RECORDS = [{"review": "good", "n": 1}, {"review": "bad, really\nbad", "n": 2}]


def test_every_input_format_reads_the_same_records(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    frame = pd.DataFrame(RECORDS)
    frame.to_csv(tmp_path / "r.csv", index=False)
    frame.to_parquet(tmp_path / "r.parquet")
    for source in (jsonl, tmp_path / "r.parquet", frame, RECORDS, iter(RECORDS)):
        assert [r for _, r in read_records(source)] == RECORDS, source
    # CSV cells are text (the function's types convert them).
    assert [r for _, r in read_records(tmp_path / "r.csv")] == [
        {"review": "good", "n": "1"},
        {"review": "bad, really\nbad", "n": "2"},
    ]
    for source in (jsonl, tmp_path / "r.csv", tmp_path / "r.parquet", frame, RECORDS):
        assert count_records(source) == 2
    assert count_records(iter(RECORDS)) is None


def test_unreadable_records_are_row_errors_and_bad_sources_are_refused(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"review": "ok"}\n{not json\n[1, 2]\n\n{"review": "fine"}\n')
    rows = list(read_records(jsonl))
    assert [row for row, _ in rows] == [0, 1, 2, 3]
    assert isinstance(rows[1][1], RecordError) and "not JSON" in rows[1][1].reason
    assert rows[1][1].row == 1 and "not a JSON object" in rows[2][1].reason
    assert isinstance(list(read_records([{"a": 1}, "text"]))[1][1], RecordError)
    with pytest.raises(InvalidRequestError, match="no such records file"):
        list(read_records(tmp_path / "missing.csv"))
    (tmp_path / "r.txt").write_text("review\n")
    with pytest.raises(InvalidRequestError, match="suffix"):
        list(read_records(tmp_path / "r.txt"))
    with pytest.raises(InvalidRequestError, match="records must be"):
        list(read_records(42))


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_results_resume_after_a_cut_line_and_end_in_row_order(tmp_path, suffix):
    out = tmp_path / f"out{suffix}"
    writer = ResultWriter(out)
    results = [{"row": r, "label": "Yes", "probs": {"Yes": 0.75, "No": 0.25}} for r in (3, 0)]
    writer.write(results)
    writer.write_errors([(1, "missing field 'review'", {"text": "x" * 500})])
    assert not out.exists()  # the output appears whole, when the job ends
    with open(writer.journal, "a") as f:  # a kill in the middle of a line
        f.write('{"row": 2, "lab')
    again = ResultWriter(out)
    done, failed = again.done()
    assert sorted(done) == [0, 3] and failed == {1}
    assert not writer.journal.read_text().endswith("lab")  # the cut line is gone
    again.write([{"row": 2, "label": "No", "probs": {"Yes": 0.5, "No": 0.5}}])
    assert again.finish() == 3
    if suffix == ".jsonl":
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert rows[0] == {"row": 0, "label": "Yes", "probs": {"Yes": 0.75, "No": 0.25}}
    elif suffix == ".csv":
        rows = list(csv.DictReader(out.open()))
        assert rows[0] == {"row": "0", "label": "Yes", "prob_Yes": "0.75", "prob_No": "0.25"}
    else:
        rows = pd.read_parquet(out).to_dict("records")
        assert rows[0] == flatten(results[1])
    assert not writer.journal.exists()
    assert [int(r["row"]) for r in rows] == [0, 2, 3]
    error = json.loads(writer.errors_path.read_text())
    assert error["row"] == 1 and len(error["record"]["text"]) == 200
    # A finished output can be resumed too (more records added later).
    assert sorted(ResultWriter(out).done()[0]) == [0, 2, 3]


def test_a_file_this_runner_did_not_write_is_not_taken_for_results(tmp_path):
    out = tmp_path / "notes.jsonl"
    out.write_text('{"hello": 1}\n')  # an output of someone else's
    with pytest.raises(InvalidRequestError, match="no row number"):
        ResultWriter(out).done()
    with pytest.raises(InvalidRequestError, match="does not exist"):
        ResultWriter(tmp_path / "nowhere" / "out.jsonl")


def test_the_batch_command_refuses_bad_arguments_before_starting_an_engine(tmp_path, capsys):
    from prefillonly_sgl.cli import main

    app = str(Path(__file__).with_name("batch_app_example.py"))
    out = str(tmp_path / "out.csv")
    assert main(["batch", f"{app}:liked", str(tmp_path / "missing.csv"), out]) == 2
    assert "no such records file" in capsys.readouterr().err
    (tmp_path / "r.csv").write_text("review\ngood\n")
    assert main(["batch", app, str(tmp_path / "r.csv"), out]) == 2  # two functions in it
    assert "name one" in capsys.readouterr().err
    assert main(["batch", f"{app}:nope", str(tmp_path / "r.csv"), out]) == 2
    assert main(["batch", f"{app}:liked", str(tmp_path / "r.csv"), out, "--column", "x"]) == 2
    assert not Path(out).exists()


def test_a_record_that_keeps_failing_aborts_once_without_retrying_its_whole_chunk():
    """A chunk refused as invalid is split; when a half then fails for another reason its
    retries are the job's: the abort is not caught and the chunk not retried again."""
    from prefillonly_sgl.batch import BatchAborted
    from prefillonly_sgl.batch.scoring import BatchReport, score_chunk
    from prefillonly_sgl.batch.tasks import Prepared

    class Refusing:  # plain stand-in for a task (no engine needed)
        def score(self, backend, chunk):
            if len(chunk) > 1:
                raise InvalidRequestError("one of these is too long")
            raise OSError("connection refused")

    chunk = [Prepared(row, {}, None, "", {}) for row in range(2)]
    report = BatchReport(Path("out"), Path("errors"))
    with pytest.raises(BatchAborted, match="rerun the same job"):
        score_chunk(Refusing(), None, chunk, report, retries=1)
    assert report.calls == 3  # the pair once, then the first half twice
