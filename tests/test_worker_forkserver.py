"""Workers forked from the forkserver start as spawned ones would
(sglang_runtime/worker_forkserver.py): with the caller's environment and stdio at their
start, SIGQUIT's default action, their titles; and SGLang's engine module is swapped back.
The Engines and servers of the whole suite run this way (tests/conftest.py); SGLang's
spawn runs in test_engine_lifecycle.py's user scripts."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from prefillonly_sgl.sglang_runtime import worker_forkserver


def report_start(path: str) -> None:
    """A worker's target: what it inherited, written to ``path`` and to its stderr."""
    quit_action = signal.getsignal(signal.SIGQUIT)
    with open(path, "w") as out:
        out.write(f"{os.environ.get('PREFILLONLY_TEST_MARK')}|{quit_action == signal.SIG_DFL}")
    print("worker's stderr line", file=sys.stderr, flush=True)


def test_a_forked_worker_has_its_callers_environment_and_stderr(tmp_path, capfd):
    worker_forkserver.ensure_running()  # up already where an Engine of the suite ran
    os.environ["PREFILLONLY_TEST_MARK"] = "set after the forkserver started"
    try:
        worker = worker_forkserver.ForkedWorker(target=report_start, args=(str(tmp_path / "r"),))
        worker.start()
        worker.join(timeout=60)
    finally:
        del os.environ["PREFILLONLY_TEST_MARK"]
    assert worker.exitcode == 0
    assert (tmp_path / "r").read_text() == "set after the forkserver started|True"
    assert "worker's stderr line" in capfd.readouterr().err  # this test's captured fd 2
    assert worker_forkserver.forkserver_pid() is not None


def test_engine_module_is_swapped_only_while_an_engine_starts():
    from sglang.srt.entrypoints import engine as engine_module

    original = engine_module.mp
    with worker_forkserver.workers_started(worker_forkserver.FORKSERVER):
        assert engine_module.mp.Process is worker_forkserver.ForkedWorker
        engine_module.mp.set_start_method("spawn", force=True)  # SGLang's call: a no-op
        assert engine_module.mp.get_start_method() == original.get_start_method()
    assert engine_module.mp is original
    with worker_forkserver.workers_started(worker_forkserver.SPAWN):
        assert engine_module.mp is original


def test_an_unknown_mode_is_named():
    assert worker_forkserver.check_mode(None) == "spawn"
    with pytest.raises(ValueError, match="PREFILLONLY_WORKER_START='fork'.*spawn, forkserver"):
        worker_forkserver.check_mode("fork")


def test_the_suites_engines_fork_their_workers(tiny_engine):
    """The session's Engine: its scheduler and detokenizer are the forkserver's children,
    titled as SGLang titles them, and owned by the engine (its shutdown stops them)."""
    import psutil

    # the finalizer's arguments: (shutdown, SGLang's engine, the owned processes, watch)
    owned = tiny_engine._finalizer.peek()[2][2]
    titles = sorted(p.cmdline()[0].split()[0] for p in owned)
    assert titles == ["sglang::detokenizer", "sglang::scheduler"]
    assert {p.ppid() for p in owned} == {worker_forkserver.forkserver_pid()}
    assert psutil.Process(worker_forkserver.forkserver_pid()).cmdline()[0] == (
        "prefillonly::worker_forkserver"
    )


def test_the_callers_own_preloads_are_kept():
    """ensure_running imports ours first and keeps what the caller asked multiprocessing
    for (the suite: its servers' modules, tests/forked_server.py)."""
    import multiprocessing.forkserver

    import forked_server

    worker_forkserver.ensure_running()
    preload = multiprocessing.forkserver._forkserver._preload_modules
    assert preload[0] == worker_forkserver.PRELOAD_MODULE
    assert set(forked_server.SERVER_MODULES) <= set(preload)


def test_a_forked_servers_processes_are_its_own(apps_server):
    """A server of the suite (forked already imported, tests/forked_server.py): its own
    process group, its own workers' forkserver (titled as ours) and SGLang's workers
    under it, none of them the suite's."""
    import psutil

    root = psutil.Process(apps_server.proc.pid)
    assert os.getpgid(root.pid) == root.pid != os.getpgrp()
    tree = root.children(recursive=True)
    assert all(os.getpgid(p.pid) == root.pid for p in tree)
    forkservers = [p for p in root.children() if p.cmdline()[0] == "prefillonly::worker_forkserver"]
    assert len(forkservers) == 1 and forkservers[0].pid != worker_forkserver.forkserver_pid()
    workers = sorted(p.cmdline()[0].split()[0] for p in forkservers[0].children())
    assert workers == ["sglang::detokenizer", "sglang::scheduler"]
