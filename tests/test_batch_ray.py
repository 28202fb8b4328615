"""The batch runner on a real local Ray cluster (2 CPUs, two engine actors, tiny random
Llama in float32): results equal the local runner's row for row, each prefix group is
computed once per job (the cached tokens equal the local runner's, whose single engine
computes each prefix once), bad records go to the errors file, results are written with
Ray Data's writers, and the `prefillonly batch --ray` command runs the same job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from batch_app_example import liked, recommend
from server_process import serve_env

from prefillonly_sgl import Engine
from prefillonly_sgl.batch import run_batch

ray = pytest.importorskip("ray", reason="the Ray extra: pip install 'prefillonly-sgl[ray]'")

from prefillonly_sgl.batch.ray_runner import bucket_count, bucket_of  # noqa: E402

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


def test_the_ray_executor_needs_engine_options_not_an_engine(engine_options):
    from prefillonly_sgl.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="keyword arguments"):
        run_batch(recommend, RECORDS, "x.parquet", executor="ray", engine="http://x:1")
    with pytest.raises(InvalidRequestError, match="'local' or 'ray'"):
        run_batch(recommend, RECORDS, "x.parquet", executor="dask")


def test_ray_results_equal_the_local_runner_with_each_prefix_computed_once(
    cluster, engine_options, tmp_path
):
    records = RECORDS[:6] + [BAD] + RECORDS[6:]
    with Engine(**engine_options) as engine:
        local_out = tmp_path / "local.jsonl"
        local = run_batch(recommend, records, local_out, engine=engine, keep=["id"],
                          progress=False)  # fmt: skip
    local_rows = [json.loads(line) for line in local_out.read_text().splitlines()]

    out = tmp_path / "ray_results.parquet"
    result = run_batch(recommend, records, out, executor="ray", engine=engine_options,
                       keep=["id"], ray={"replicas": 2, "bucket_size": 4})  # fmt: skip
    rows = result.results.take_all()
    assert [r["row"] for r in rows] == [r["row"] for r in local_rows]
    assert [r["id"] for r in rows] == [r["id"] for r in local_rows]
    for got, want in zip(rows, local_rows, strict=True):
        assert abs(got["score"] - want["score"]) < TOLERANCE
    # The bad record: reported, with the local runner's reason, not scored.
    assert [e["row"] for e in result.errors] == [6] and "item" in result.errors[0]["reason"]
    assert result.errors_file.exists() and local.errors == 1
    # Each user's prefix computed once in the whole job, as on the single local engine.
    # A prefix computed twice (a user split across actors) would add a whole profile
    # (>= 64 tokens) of uncached work; scheduling timing moves item tokens only.
    assert result.prompt_tokens == local.prompt_tokens > 0
    assert result.cached_tokens > 0 and local.cached_tokens > 0
    uncached, local_uncached = (r.prompt_tokens - r.cached_tokens for r in (result, local))
    assert uncached < local_uncached + 64, (result.cached_tokens, local.cached_tokens)
    # Written with Ray Data's Parquet writer: a folder of files, the same rows.
    assert out.is_dir() and ray.data.read_parquet(str(out)).count() == len(rows)


def test_the_batch_command_runs_on_ray(cluster, engine_options, tmp_path):
    import pandas as pd

    source = tmp_path / "reviews.csv"
    pd.DataFrame([{"review": "it worked", "drug": "a"}, {"review": "awful", "drug": "b"}]).to_csv(
        source, index=False
    )
    out = tmp_path / "labels.jsonl"
    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "prefillonly_sgl", "batch", f"{APP}:liked", str(source),
               str(out), "--model", engine_options["model"], "--device", "cpu", "--dtype",
               "float32", "--ray", address, "--replicas", "1"]  # fmt: skip
    done = subprocess.run(command, env=serve_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scored on Ray" in done.stdout
    rows = sorted(ray.data.read_json(str(out)).take_all(), key=lambda r: r["row"])
    assert [r["row"] for r in rows] == [0, 1]
    assert all(r["label"] in liked.labels.texts for r in rows)
    assert all(abs(sum(r["probs"].values()) - 1) < 1e-5 for r in rows)
