"""Engine start-up and shutdown as users meet them: a script without a __main__ guard,
context managers, and no process left behind (nor other processes killed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # several engines started and shut down

# The failing start without a forkserver: SGLang's spawn, what a user gets by default (the
# suite forks its engines' workers, tests/conftest.py, and so do the other two scripts).
SPAWN = {**os.environ, "PREFILLONLY_WORKER_START": "spawn"}

# Written the way users write it first: no `if __name__ == "__main__":` guard, although
# SGLang starts its workers with multiprocessing "spawn" (and the forkserver, which runs
# here, prepares each worker the same way).
GUARDLESS_SCRIPT = textwrap.dedent(
    """
    import subprocess, sys
    from multiprocessing import resource_tracker
    import psutil
    import prefillonly_sgl

    bystander = subprocess.Popen(["sleep", "120"])  # the user's own child: must survive

    engine = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    from multiprocessing import forkserver
    tracker = resource_tracker._resource_tracker._pid  # multiprocessing's helper processes,
    shared = {tracker, forkserver._forkserver._forkserver_pid}  # which serve every engine
    ours = {p.pid for p in psutil.Process().children(recursive=True)} - {bystander.pid, *shared}
    yes = engine.tokenizer.encode(" Yes", add_special_tokens=False)[0]
    print("scores", engine.score("Question:", [" a", " b"], [yes]).scores)
    engine.shutdown()
    engine.shutdown()  # idempotent
    try:
        engine.score("Question:", [" a"], [yes])
    except prefillonly_sgl.EngineClosedError as e:
        print("closed:", e)
    alive = [pid for pid in ours if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    print("engine processes alive:", alive)
    print("bystander alive:", bystander.poll() is None)
    print("resource tracker alive:", tracker is None or psutil.pid_exists(tracker))
    bystander.kill()

    # A second engine scores after the first one's shutdown; then two engines shut down
    # from two threads at once: each kills its own processes.
    import threading
    before = {p.pid for p in psutil.Process().children()}
    e3 = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    print("second engine", len(e3.score("Q", [" a"], [yes]).scores))
    e4 = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    both = {p.pid for p in psutil.Process().children(recursive=True)} - before - {tracker}
    threads = [threading.Thread(target=e.shutdown) for e in (e3, e4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    alive = [pid for pid in both if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    print("after concurrent shutdowns alive:", alive)
    """
)


def test_guardless_script_scores_and_cleans_up(tmp_path, tiny_llama_path):
    script = tmp_path / "user_script.py"
    script.write_text(GUARDLESS_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_llama_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout
    assert "scores [[1.0], [1.0]]" in lines  # one label: softmax over it is 1
    assert "closed: this Engine has been shut down" in lines
    assert "engine processes alive: []" in lines
    assert "bystander alive: True" in lines
    assert "resource tracker alive: True" in lines
    assert "second engine 1" in lines
    assert "after concurrent shutdowns alive: []" in lines
    assert "KeyError" not in out.stderr  # the resource tracker was not killed
    # SGLang's workers end with SIGKILL: nothing of theirs may stay registered with the
    # resource tracker (it warned about a leaked semaphore at exit)
    assert "leaked" not in out.stderr, out.stderr[-2000:]


# A model folder SGLang's scheduler cannot load: its architecture is no model SGLang has.
# The scheduler raises, sends SIGQUIT to the caller (SGLang's launch-phase handler would
# kill the caller's whole process tree, the caller included) and exits.
FAILING_START_SCRIPT = textwrap.dedent(
    """
    import sys
    from multiprocessing import resource_tracker
    import psutil
    import prefillonly_sgl

    try:
        prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024,
                               allow_architectures=["NoSuchModelForCausalLM"])
    except prefillonly_sgl.EngineStartError as e:
        print("start error:", e, flush=True)
    tracker = resource_tracker._resource_tracker._pid
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if p.pid != tracker and p.status() != psutil.STATUS_ZOMBIE]
    print("processes left:", left)
    """
)


@pytest.mark.faults
def test_worker_failing_at_start_raises_in_the_caller(tmp_path, tiny_llama_path):
    import json
    import shutil

    model = tmp_path / "unservable"
    shutil.copytree(tiny_llama_path, model)
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    script = tmp_path / "failing_start.py"
    script.write_text(FAILING_START_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(model)],
        capture_output=True,
        text=True,
        timeout=300,
        env=SPAWN,
    )
    # Before the fix the caller was killed (SIGKILL, exit code -9) and printed nothing.
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    message = next(line for line in out.stdout.splitlines() if line.startswith("start error:"))
    assert "architecture NoSuchModelForCausalLM in its config.json" in message
    assert "docs/models.md" in message and "prefillonly verify" in message  # the family table
    # the scheduler's own last error line, which only its stderr had
    assert "ValueError: Cannot find model module. 'NoSuchModelForCausalLM'" in message
    assert "processes left: []" in out.stdout


# An engine whose scheduler dies after start (the OOM killer's SIGKILL) while a score call
# waits on it; and before that, a worker's SIGQUIT after start (how a scheduler that hits
# an exception reports it; SGLang's running-phase handler kills the caller's process tree).
DYING_WORKER_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from multiprocessing import resource_tracker
    import psutil
    import prefillonly_sgl

    engine = prefillonly_sgl.Engine(sys.argv[1], device="cpu", max_total_tokens=1024)
    yes = engine.tokenizer.encode(" Yes", add_special_tokens=False)[0]
    engine.score("Q:", [" a"], [yes])  # SGLang's running-phase handler is installed now
    os.kill(os.getpid(), signal.SIGQUIT)
    print("after SIGQUIT", engine.score("Q:", [" a"], [yes]).scores, flush=True)

    # (a forked worker is the forkserver's child: PREFILLONLY_WORKER_START=forkserver)
    scheduler = next(p for p in psutil.Process().children(recursive=True)
                     if "scheduler" in " ".join(p.cmdline()))
    scheduler.suspend()  # the next call waits on it ...
    threading.Timer(1.0, scheduler.kill).start()  # ... until it dies
    try:
        engine.score("Q:", [" a", " b"], [yes])
    except prefillonly_sgl.EngineDiedError as e:
        print("died:", e, flush=True)
    try:
        engine.score("Q:", [" a"], [yes])
    except prefillonly_sgl.EngineDiedError:
        print("next call: EngineDiedError", flush=True)
    from multiprocessing import forkserver
    # multiprocessing's helpers serve every engine of the process and stay up
    shared = {resource_tracker._resource_tracker._pid, forkserver._forkserver._forkserver_pid}
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if p.pid not in shared and p.status() != psutil.STATUS_ZOMBIE]
    print("processes left:", left)
    engine.shutdown()
    print("shut down")
    """
)


@pytest.mark.faults
def test_worker_dying_after_start_fails_the_call_not_the_caller(tmp_path, tiny_llama_path):
    script = tmp_path / "dying_worker.py"
    script.write_text(DYING_WORKER_SCRIPT)
    # The harness's timeout is the no-hang check: a dead scheduler never answers.
    out = subprocess.run(
        [sys.executable, str(script), str(tiny_llama_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    assert "after SIGQUIT [[1.0]]" in out.stdout
    died = next(line for line in out.stdout.splitlines() if line.startswith("died:"))
    assert "sglang::scheduler process" in died and "killed by SIGKILL" in died
    assert "next call: EngineDiedError" in out.stdout
    assert "processes left: []" in out.stdout  # the detokenizer was stopped
    assert "shut down" in out.stdout
