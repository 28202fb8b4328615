"""The batch runner on a real Engine and a real server (tiny random Llama, float32):
results equal the DSL's own calls in input order, records sharing a prefix go out
together, bad records land in the errors file without stopping the job, a killed
`prefillonly batch` resumes without rescoring a finished row (the requests are counted),
and the server backend gives the local results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from batch_app_example import liked, recommend, verdict
from conftest import counting_backend, max_abs_diff
from server_process import serve_env

from prefillonly_sgl.batch import run_batch

pytestmark = pytest.mark.slow  # a server besides the engine

APP = Path(__file__).with_name("batch_app_example.py")
REVIEWS = ["I feel much better now", "would not take it again", "ok", "it worked"]
RECORDS = [{"id": f"r{i}", "review": REVIEWS[i % 4], "drug": f"drug {i % 3}"} for i in range(12)]


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine  # conftest: one per session


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def probs_of(results, labels=("Yes", "No")) -> list[list[float]]:
    return [[r["probs"][label] for label in labels] for r in results]


def test_classifier_results_equal_the_dsl_in_input_order_with_one_request_per_chunk(
    engine, tmp_path
):
    backend = counting_backend(engine)
    out = tmp_path / "out.jsonl"
    report = run_batch(liked, RECORDS, out, engine=backend, keep=["id"], chunk_size=5,
                       progress=False)  # fmt: skip
    rows = read_jsonl(out)
    assert [r["row"] for r in rows] == list(range(12)) and rows[3]["id"] == "r3"
    want = liked.batch([{"review": r["review"], "drug": r["drug"]} for r in RECORDS],
                       engine=engine, progress=False)  # fmt: skip
    assert max_abs_diff(probs_of(rows), [[w.probs["Yes"], w.probs["No"]] for w in want]) < 1e-6
    assert [r["label"] for r in rows] == [w.label for w in want]
    # One shared few-shot prefix: each chunk of 5 records is one score request.
    assert len(backend.requests) == 3 and backend.items_sent == 12
    assert report.scored == 12 and report.errors == 0 and report.calls == 3
    assert report.cached_tokens > 0  # the prefix computed once, then served from the cache


def test_labels_of_several_tokens_in_a_batch_job(engine, tmp_path):
    out = tmp_path / "out.jsonl"
    records = RECORDS[:5]
    run_batch(verdict, records, out, engine=engine, chunk_size=3, progress=False)
    rows = read_jsonl(out)
    inputs = [{"review": r["review"], "drug": r["drug"]} for r in records]
    want = verdict.batch(inputs, engine=engine, progress=False)
    labels = ("Yes", "history books", "No thanks")
    assert max_abs_diff(probs_of(rows, labels), [[w.probs[x] for x in labels] for w in want]) < 1e-6
    assert [r["label"] for r in rows] == [w.label for w in want]


def test_bad_records_go_to_the_errors_file_and_the_job_goes_on(engine, tmp_path):
    records = [
        RECORDS[0],
        {"id": "no-review", "drug": "x"},  # missing field
        {"id": "list", "review": ["not", "text"]},  # wrong type
        {"id": "long", "review": "word " * 5000},  # longer than the engine accepts
        RECORDS[1],
    ]
    out = tmp_path / "out.csv"
    report = run_batch(liked, records, out, engine=engine, keep=["id"], progress=False)
    assert report.scored == 2 and report.errors == 3
    rows = pd.read_csv(out).to_dict("records")
    assert [r["id"] for r in rows] == ["r0", "r1"] and set(rows[0]) >= {"prob_Yes", "prob_No"}
    errors = {e["row"]: e["reason"] for e in read_jsonl(report.errors_file)}
    assert "missing field 'review'" in errors[1]
    assert "review" in errors[2] and "string" in errors[2]
    assert "longer than" in errors[3]
    # A rerun finds everything done: nothing is sent, the errors are not retried.
    backend = counting_backend(engine)
    again = run_batch(liked, records, out, engine=backend, keep=["id"], progress=False)
    assert again.skipped == 5 and again.scored == 0 and backend.items_sent == 0


def test_ranker_records_of_one_user_are_one_ranking_call(engine, tmp_path):
    users = {"u1": "likes space films", "u2": "likes cooking shows"}
    records = [
        {"user": u, "profile": p, "item": item}
        for item in ("a space opera", "a bake-off", "moon landing")
        for u, p in users.items()
    ]
    backend = counting_backend(engine)
    frame = pd.DataFrame(records)
    out = tmp_path / "ranked.parquet"
    run_batch(recommend, frame, out, engine=backend, keep=["user"], progress=False)
    rows = pd.read_parquet(out).to_dict("records")
    assert len(backend.requests) == 2  # one per user, not one per record
    for user, profile in users.items():
        ranking = recommend(profile, items=[r["item"] for r in records if r["user"] == user],
                            engine=engine)  # fmt: skip
        got = [r["score"] for r in rows if r["user"] == user]
        assert max(abs(a - b.score) for a, b in zip(got, ranking.by_input)) < 1e-6


@pytest.mark.faults  # a batch job SIGKILLed
def test_a_killed_batch_job_resumes_without_rescoring(engine, tiny_llama_path, tmp_path):
    records = tmp_path / "reviews.jsonl"
    many = [{"review": f"{REVIEWS[i % 4]} ({i})", "drug": "d"} for i in range(400)]
    records.write_text("".join(json.dumps(r) + "\n" for r in many))
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "prefillonly_sgl", "batch", f"{APP}:liked", str(records),
               str(out), "--model", str(tiny_llama_path), "--device", "cpu", "--dtype", "float32",
               "--chunk-size",
               "1", "--no-progress"]  # fmt: skip
    job = subprocess.Popen(command, env=serve_env(), start_new_session=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            journal = out.with_name(out.name + ".partial.jsonl")
            if journal.exists() and journal.read_text().count("\n") >= 20:
                break
            time.sleep(0.05)
        assert job.poll() is None, f"the job ended before it was killed:\n{job.stdout.read()}"
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    journal = out.with_name(out.name + ".partial.jsonl")
    finished = len(journal.read_text().splitlines())  # a cut last line is not counted as done
    assert 20 <= finished < 400 and not out.exists()  # no half-written output
    backend = counting_backend(engine)
    report = run_batch(liked, records, out, engine=backend, progress=False)
    assert backend.items_sent == report.scored == 400 - report.skipped
    assert report.skipped >= finished - 1
    rows = read_jsonl(out)
    assert [r["row"] for r in rows] == list(range(400))
    want = liked.batch(many, engine=engine, progress=False)
    assert max_abs_diff(probs_of(rows), [[w.probs["Yes"], w.probs["No"]] for w in want]) < 1e-5


def test_the_server_backend_gives_the_local_results(engine, apps_server, tmp_path):
    out_local, out_remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    run_batch(liked, RECORDS, out_local, engine=engine, progress=False)
    url = apps_server.url  # conftest: one per session (liked is not one of its apps)
    report = run_batch(liked, RECORDS, out_remote, engine=url, progress=False)
    # Again, into another file: the server's prefix cache now holds the shared prefix.
    # (The first run's 12 items share only a short prefix, so the scheduler runs them in
    # one batch, none a cache hit of another.)
    again = run_batch(liked, RECORDS, tmp_path / "again.jsonl", engine=url, progress=False)
    assert report.scored == again.scored == 12 and again.cached_tokens > 0
    assert max_abs_diff(probs_of(read_jsonl(out_local)), probs_of(read_jsonl(out_remote))) < 1e-5


def interrupting_backend(engine):
    """The real local backend, with Ctrl-C pressed during its third request."""
    backend = counting_backend(engine)
    score = backend.score

    async def interrupted(request):
        if len(backend.requests) == 2:
            raise KeyboardInterrupt
        return await score(request)

    backend.score = interrupted
    return backend


def test_ctrl_c_leaves_a_valid_output_and_a_rerun_scores_only_the_rest(engine, tmp_path):
    out = tmp_path / "out.csv"
    with pytest.raises(KeyboardInterrupt):
        run_batch(liked, RECORDS, out, engine=interrupting_backend(engine), chunk_size=4,
                  progress=False)  # fmt: skip
    assert [r["row"] for r in pd.read_csv(out).to_dict("records")] == list(range(8))
    backend = counting_backend(engine)
    report = run_batch(liked, RECORDS, out, engine=backend, chunk_size=4, progress=False)
    assert report.skipped == 8 and backend.items_sent == 4
    assert [r["row"] for r in pd.read_csv(out).to_dict("records")] == list(range(12))


def test_a_server_that_is_gone_aborts_the_job_with_what_to_do(tmp_path):
    from prefillonly_sgl.batch import BatchAborted
    from prefillonly_sgl.scoring.errors import InvalidRequestError

    with pytest.raises(BatchAborted, match="rerun the same job to resume"):
        run_batch(liked, RECORDS, tmp_path / "out.jsonl", engine="http://127.0.0.1:9",
                  retries=0, progress=False)  # fmt: skip
    with pytest.raises(InvalidRequestError, match="no such records file"):
        run_batch(liked, tmp_path / "missing.csv", tmp_path / "x.jsonl", progress=False)
    assert not (tmp_path / "x.jsonl").exists()
