"""WorkerWatch: an offline Engine's worker dying after start, noticed without signals
(a thread polls the engine's processes): it stops the engine's other processes, and the
calls waiting on the engine, and every later one, raise EngineDiedError naming the
process, how it ended and its last error line (worker_output.py). It replaces SGLang's
SubprocessWatchdog, whose answer to a dead worker is a SIGQUIT that kills the caller
(offline_engine.py stops that watchdog)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import threading

import psutil

from prefillonly_sgl.scoring.errors import EngineDiedError
from prefillonly_sgl.sglang_runtime.owned_processes import kill_trees
from prefillonly_sgl.sglang_runtime.worker_output import WorkerOutput


class WorkerWatch:
    """Notices an engine's worker process dying after start, without signals: stops the
    engine's other processes (no orphans) and fails the calls waiting on it with
    EngineDiedError; later calls raise it too (Engine._require_running)."""

    def __init__(
        self,
        processes: list[psutil.Process],
        output: WorkerOutput,
        handles: dict[int, multiprocessing.process.BaseProcess] | None = None,
    ) -> None:
        self._processes = processes
        # multiprocessing's handles of the workers, which know how a forked worker (a
        # child of the forkserver, not of this process) ended.
        self._handles = handles or {}
        self._titles = {p.pid: _process_title(p) for p in processes}
        self._output = output
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self.death: str | None = None
        threading.Thread(target=self._run, daemon=True, name="prefillonly-worker-watch").start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            dead = next((p for p in self._processes if not _alive(p)), None)
            if dead is None:
                continue
            death = self._describe(dead)
            with self._lock:
                if self._stop.is_set():
                    return  # a shutdown's kill
                self.death = death
                waiters = list(self._waiters)
            kill_trees(self._processes)
            for loop, died in waiters:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    loop.call_soon_threadsafe(_settle, died)
            return

    def _describe(self, dead: psutil.Process) -> str:
        how = _exit_status(dead.pid, self._handles.get(dead.pid))
        self._stop.wait(0.5)  # the pump may still be passing on its last lines
        line = self._output.last_error_line()
        return (
            f"SGLang's {self._titles[dead.pid]} process (pid {dead.pid}) died after the "
            f"engine started ({how})"
            + (f"; its last error line: {line}" if line else "")
            + ". This Engine's other processes were stopped; create a new Engine."
        )

    async def until_died(self, awaitable):
        """The awaitable's result, or EngineDiedError once a worker dies."""
        loop = asyncio.get_running_loop()
        died = loop.create_future()
        with self._lock:
            if self.death is not None:
                if asyncio.iscoroutine(awaitable):
                    awaitable.close()  # never awaited: no "never awaited" warning
                raise EngineDiedError(self.death)
            self._waiters.add((loop, died))
        task = asyncio.ensure_future(awaitable)
        try:
            await asyncio.wait({task, died}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (Ctrl-C): the call's task with it
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise
        finally:
            with self._lock:
                self._waiters.discard((loop, died))
        if task.done():
            return task.result()
        task.cancel()  # its answer will never come
        raise EngineDiedError(self.death)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _process_title(process: psutil.Process) -> str:
    """SGLang titles its workers (sglang::scheduler, sglang::detokenizer)."""
    with contextlib.suppress(psutil.Error, IndexError):
        return process.cmdline()[0].split()[0]
    return "worker"


def _exit_status(pid: int, handle: multiprocessing.process.BaseProcess | None = None) -> str:
    """How a dead worker ended: a child of this process read without reaping it
    (multiprocessing reaps it), a forked one from its multiprocessing handle."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        info = None
        if handle is not None:
            handle.join(timeout=5)  # the forkserver reports the exit as it reaps it
            code = handle.exitcode
            if code is not None and code < 0:
                return f"killed by {signal.Signals(-code).name}"
            if code is not None:
                return f"exit code {code}"
    if info is None:
        return "exit status unknown"
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return f"killed by {signal.Signals(info.si_status).name}"
    return f"exit code {info.si_status}"
