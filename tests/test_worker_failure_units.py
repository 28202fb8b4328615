"""The pieces that keep a failing SGLang worker from taking the caller down, without an
engine: the start error's wording, the workers' stderr kept and passed on, and the watch
that turns a dead worker into EngineDiedError (tests/test_engine_lifecycle.py runs them
with real engines)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import psutil
import pytest

from prefillonly_sgl.scoring.errors import EngineClosedError, EngineDiedError
from prefillonly_sgl.sglang_runtime.offline_engine import start_failure_message
from prefillonly_sgl.sglang_runtime.worker_output import WorkerOutput
from prefillonly_sgl.sglang_runtime.worker_watch import WorkerWatch


def _model(tmp_path, architecture):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    return tmp_path


def test_start_error_names_an_unknown_architecture_and_the_family_table(tmp_path):
    message = start_failure_message(
        _model(tmp_path, "NoSuchForCausalLM"), RuntimeError("rank 0 died"), "ValueError: no"
    )
    assert "architecture NoSuchForCausalLM in its config.json" in message
    assert "docs/models.md" in message and "prefillonly verify" in message
    assert message.endswith("a worker process failed: ValueError: no")


def test_start_error_names_a_known_family(tmp_path):
    message = start_failure_message(
        _model(tmp_path, "LlamaForCausalLM"), RuntimeError("rank 0 died"), None
    )
    assert "Llama family, architecture LlamaForCausalLM; docs/models.md" in message
    assert message.endswith(": rank 0 died")  # no worker line: SGLang's own error


def test_worker_output_is_passed_on_and_its_last_error_line_kept(capfd):
    output = WorkerOutput()
    with output.capturing():
        # a child spawned while capturing writes to the pipe, as SGLang's workers do
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; print('log line', file=sys.stderr); "
                "raise ValueError('Cannot find model module')",
            ]  # fmt: skip
        )
    child.wait(timeout=60)
    deadline = time.monotonic() + 10
    while output.last_error_line() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the pump thread passes the output on as it comes
    assert output.last_error_line() == "ValueError: Cannot find model module"
    assert "log line" in capfd.readouterr().err  # and the caller still sees it
    output.mark_started()
    assert output.last_error_line() is None  # a later death is not blamed on it


def test_watch_turns_a_dead_worker_into_engine_died_error():
    worker = subprocess.Popen(["sleep", "60"])
    process = psutil.Process(worker.pid)
    # The watch names a worker by its command line, read when it starts watching (an
    # SGLang worker has long had its title by then); a just-exec'd one can read empty.
    deadline = time.monotonic() + 10
    while not process.cmdline() and time.monotonic() < deadline:
        time.sleep(0.05)
    watch = WorkerWatch([process], WorkerOutput())

    async def waiting_call():
        await asyncio.sleep(60)  # a call the dead worker would never answer

    async def main():
        asyncio.get_running_loop().call_later(0.2, worker.kill)
        with pytest.raises(EngineDiedError) as died:
            await asyncio.wait_for(watch.until_died(waiting_call()), timeout=30)
        return str(died.value)

    message = asyncio.run(main())
    assert "sleep process" in message and "killed by SIGKILL" in message
    assert watch.death == message
    assert isinstance(EngineDiedError(message), EngineClosedError)
    worker.wait(timeout=10)


def test_watch_stopped_by_a_shutdown_reports_no_death():
    worker = subprocess.Popen(["sleep", "60"])
    watch = WorkerWatch([psutil.Process(worker.pid)], WorkerOutput())
    watch.stop()
    worker.kill()
    worker.wait(timeout=10)
    time.sleep(1.0)  # two of the watch's polls
    assert watch.death is None
