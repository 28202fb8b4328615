"""The batch runner on a real local Ray cluster (2 CPUs, two engine actors, tiny random
Llama in float32): results equal the local runner's row for row, in the same BatchReport,
each prefix group is computed once per job (the cached tokens equal the local runner's,
whose single engine computes each prefix once), bad records go to the errors file,
results are written in the local runner's rows, a rerun resumes, and arguments Ray cannot
honour are refused. Faults: an engine actor SIGKILLed mid-job costs no row and doubles
none; a `prefillonly batch --ray` driver SIGKILLed mid-job is resumed by the same command
from the buckets it wrote, none of them scored again (--overwrite, --no-progress and
--bucket-size honoured)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import psutil
import pytest
from batch_app_example import recommend
from server_process import serve_env

from prefillonly_sgl import Engine
from prefillonly_sgl.batch import BatchReport, run_batch
from prefillonly_sgl.scoring.errors import InvalidRequestError

ray = pytest.importorskip("ray", reason="the Ray extra: pip install 'prefillonly-sgl[ray]'")

from prefillonly_sgl.batch.ray_runner import bucket_count, bucket_of, folder_format  # noqa: E402

pytestmark = pytest.mark.slow  # Ray actors and a cluster

APP = Path(__file__).with_name("batch_app_example.py")
TOLERANCE = 1e-4
# Three users (three prefixes, each starting with its own word so no two share a token)
# with four items each, interleaved as records arrive; one record lacks its item. The
# profiles are long enough (>= 64 tokens) for the JCT scheduler to treat each as a prefix
# group: one item computes it, the others follow as cache hits, so the cached tokens are
# the same in every run (short shared prefixes are batched, hits then depend on timing).
USERS = {"alice": "likes quiet space films. " * 12, "bob": "watches every cooking show. " * 12,
         "carol": "reads about old trains. " * 12}  # fmt: skip
ITEMS = ["Alien", "Heat", "Chef", "Amelie"]
RECORDS = [{"id": f"{u}-{i}", "profile": f"{u} {about}", "item": item}
           for i, item in enumerate(ITEMS) for u, about in USERS.items()]  # fmt: skip
BAD = {"id": "broken", "profile": "dave likes nothing"}  # no item
# The fault tests' job: 24 users of one item each, one record per bucket (bucket_size=1),
# so the job is many small buckets and a kill lands while most are still to come.
MANY = [{"id": f"u{k}", "profile": f"user{k} watches films about trains", "item": ITEMS[k % 4]}
        for k in range(24)]  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    # This checkout's package first in the workers too (as for the servers the tests start).
    env = {"env_vars": {"PYTHONPATH": serve_env()["PYTHONPATH"]}}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def engine_options(tiny_llama_path):
    return {"model": str(tiny_llama_path), "device": "cpu", "dtype": "float32",
            "max_total_tokens": 4096}  # fmt: skip


def test_buckets_keep_a_prefix_together():
    assert bucket_of("abc", 7) == bucket_of("abc", 7)
    assert bucket_count(10, 2, 512) == 2 and bucket_count(5000, 2, 512) == 10


def test_an_output_folder_is_written_in_the_format_its_name_or_output_format_says():
    assert folder_format("out_parquet/") == folder_format("out.parquet") == "parquet"
    assert folder_format("out.jsonl") == folder_format("out.json") == "jsonl"
    assert folder_format("out.csv") == folder_format("out", "csv") == "csv"
    with pytest.raises(InvalidRequestError, match="unknown format"):
        folder_format("out", "xlsx")


def test_arguments_an_executor_cannot_honour_are_refused_by_name(tmp_path):
    with pytest.raises(InvalidRequestError, match="keyword arguments"):
        run_batch(recommend, RECORDS, "x.parquet", executor="ray", engine="http://x:1")
    with pytest.raises(InvalidRequestError, match="'local' or 'ray'"):
        run_batch(recommend, RECORDS, "x.parquet", executor="dask")
    # The local runner's prefix window: Ray orders the whole job by prefix (its buckets).
    with pytest.raises(InvalidRequestError, match="window="):
        run_batch(recommend, RECORDS, "x.parquet", executor="ray", window=100)
    with pytest.raises(InvalidRequestError, match=r"unknown option\(s\) \['replica'\]"):
        run_batch(recommend, RECORDS, "x.parquet", executor="ray", ray={"replica": 2})
    with pytest.raises(InvalidRequestError, match="ray= holds the options"):
        run_batch(recommend, RECORDS, tmp_path / "x.jsonl", ray={"replicas": 2})
    with pytest.raises(InvalidRequestError, match="writes its results to a file"):
        run_batch(recommend, RECORDS, None)
    assert not list(tmp_path.iterdir())


def test_ray_results_equal_the_local_runner_with_each_prefix_computed_once(
    cluster, engine_options, tmp_path, capfd
):
    records = RECORDS[:6] + [BAD] + RECORDS[6:]
    with Engine(**engine_options) as engine:
        local_out = tmp_path / "local.parquet"
        local = run_batch(recommend, records, local_out, engine=engine, keep=["id"],
                          progress=False)  # fmt: skip
    local_rows = pd.read_parquet(local_out).to_dict("records")

    out = tmp_path / "ray_results.parquet"
    capfd.readouterr()
    result = run_batch(recommend, records, out, executor="ray", engine=engine_options,
                       keep=["id"], ray={"replicas": 2, "bucket_size": 4})  # fmt: skip
    assert "recommend: 100%" in capfd.readouterr().err  # progress=True: the records bar
    # One report type whatever the executor, every field filled by both.
    assert type(result) is type(local) is BatchReport and result.executor == "ray"
    assert (result.records, result.scored, result.errors) == (local.records, local.scored, 1)
    assert result.calls > 0 and result.seconds > 0 and result.output == out
    rows = result.results.take_all()
    assert [r["row"] for r in rows] == [r["row"] for r in local_rows]
    assert [r["id"] for r in rows] == [r["id"] for r in local_rows]
    for got, want in zip(rows, local_rows, strict=True):
        assert abs(got["score"] - want["score"]) < TOLERANCE
        assert abs(got["prob_Yes"] - want["prob_Yes"]) < TOLERANCE  # Parquet's flat rows
    # The bad record: reported, with the local runner's reason, not scored.
    errors = [json.loads(line) for line in result.errors_file.read_text().splitlines()]
    assert [e["row"] for e in errors] == [6] and "item" in errors[0]["reason"]
    assert result.error_reasons == local.error_reasons
    # Each user's prefix computed once in the whole job, as on the single local engine.
    # A prefix computed twice (a user split across actors) would add a whole profile
    # (>= 64 tokens) of uncached work; scheduling timing moves item tokens only.
    assert result.prompt_tokens == local.prompt_tokens > 0
    assert result.cached_tokens > 0 and local.cached_tokens > 0
    uncached, local_uncached = (r.prompt_tokens - r.cached_tokens for r in (result, local))
    assert uncached < local_uncached + 64, (result.cached_tokens, local.cached_tokens)
    # Written with Ray Data's Parquet writer: a folder of files, the same rows.
    assert out.is_dir() and ray.data.read_parquet(str(out)).count() == len(rows)

    # A rerun resumes: every row is in the folder or the errors file, none scored again
    # (no actor started), and the report's results are still the whole job's.
    again = run_batch(recommend, records, out, executor="ray", engine=engine_options,
                      keep=["id"], progress=False)  # fmt: skip
    assert "recommend: " not in capfd.readouterr().err  # progress=False: no bar
    assert (again.skipped, again.scored, again.errors, again.calls) == (len(records), 0, 0, 0)
    assert [r["row"] for r in again.results.take_all()] == [r["row"] for r in rows]
    assert ray.data.read_parquet(str(out)).count() == len(rows)  # nothing written twice


def _bucket_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*"))


def _written_rows(folder: Path) -> list[int]:
    """Every row in the folder's bucket files, repeats included (each file read alone)."""
    rows = []
    for f in _bucket_files(folder):
        if f.suffix == ".parquet":
            rows += pd.read_parquet(f)["row"].tolist()
        else:
            rows += [json.loads(line)["row"] for line in f.open()]
    return rows


def _wait_for_a_bucket(folder: Path, alive) -> int:
    """Waits until the job has written its first bucket; the number of files then."""
    deadline = time.monotonic() + 300
    while not _bucket_files(folder):
        assert alive(), "the job ended before it wrote a bucket"
        assert time.monotonic() < deadline, "no bucket written in 300 s"
        time.sleep(0.01)
    return len(_bucket_files(folder))


def _engine_actors() -> list[psutil.Process]:
    """The pool's actor processes (Ray titles them after the actor class)."""
    return [p for p in psutil.process_iter(["cmdline"])
            if "MapWorker" in " ".join(p.info["cmdline"] or [])]  # fmt: skip


@pytest.mark.faults  # an actor SIGKILLed mid-job
def test_an_actor_killed_mid_job_costs_no_row_and_doubles_none(cluster, engine_options, tmp_path):
    out = tmp_path / "actor_killed.parquet"
    with ThreadPoolExecutor(1) as pool:
        options = {"replicas": 2, "bucket_size": 1}
        job = pool.submit(run_batch, recommend, MANY, out, executor="ray", engine=engine_options,
                          keep=["id"], progress=False, ray=options)  # fmt: skip
        _wait_for_a_bucket(out, lambda: not job.done())
        actors = _engine_actors()
        assert len(actors) == 2, actors
        actors[0].send_signal(signal.SIGKILL)  # its engine's processes die with it (PDEATHSIG)
        written_at_kill = len(_bucket_files(out))
        report = job.result(timeout=600)
    assert (report.scored, report.errors) == (len(MANY), 0)
    assert written_at_kill < len(_bucket_files(out))  # the kill came with buckets to go
    assert sorted(_written_rows(out)) == list(range(len(MANY)))  # each row exactly once
    assert [r["row"] for r in report.results.take_all()] == list(range(len(MANY)))
    assert not actors[0].is_running()


@pytest.mark.faults  # a driver SIGKILLed mid-job
def test_the_batch_command_on_ray_resumes_a_driver_killed_mid_job(
    cluster, engine_options, tmp_path
):
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*MANY, BAD]))
    out = tmp_path / "driver_killed.jsonl"
    out.mkdir()
    (out / "stale.json").write_text('{"row": 7, "score": 0.5, "probs": {"Yes": 0.5, "No": 0.5}}\n')
    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "prefillonly_sgl", "batch", f"{APP}:recommend", str(source),
               str(out), "--model", engine_options["model"], "--device", "cpu", "--dtype",
               "float32", "--keep", "id", "--ray", address, "--replicas", "1",
               "--bucket-size", "1", "--no-progress"]  # fmt: skip
    log = tmp_path / "driver.log"
    with open(log, "w") as sink:
        driver = subprocess.Popen([*command, "--overwrite"], env=serve_env(), stdout=sink,
                                  stderr=sink)  # fmt: skip
        try:
            _wait_for_a_bucket(out, lambda: driver.poll() is None)
        except AssertionError:
            driver.kill()
            raise AssertionError(log.read_text()[-3000:]) from None
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
    # --overwrite: the earlier run's rows are gone, not resumed.
    assert not (out / "stale.json").exists()
    before = _written_rows(out)
    assert 0 < len(before) < len(MANY) and len(set(before)) == len(before)
    errors_file = Path(f"{out}.errors.jsonl")
    assert [json.loads(line)["row"] for line in errors_file.read_text().splitlines()] == [24]

    # The same command again: the rows the killed driver wrote and its bad record are
    # skipped, only the rest scored; no bar (--no-progress).
    again = subprocess.run(command, env=serve_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(MANY) - len(before)} scored on Ray" in again.stdout, again.stdout
    assert f"{len(before) + 1} already done, 0 errors" in again.stdout, again.stdout
    assert "recommend: " not in again.stderr
    assert sorted(_written_rows(out)) == list(range(len(MANY)))  # each row exactly once
    assert len(errors_file.read_text().splitlines()) == 1
    rows = sorted((json.loads(line) for f in _bucket_files(out) for line in f.open()),
                  key=lambda r: r["row"])  # fmt: skip
    assert [r["id"] for r in rows] == [r["id"] for r in MANY]
    assert all(abs(sum(r["probs"].values()) - 1) < 1e-5 for r in rows)
