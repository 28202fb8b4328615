"""Which processes an offline Engine of ours started, and stopping them: this process's
children and multiprocessing's record of the processes it started (a forked worker is a
child of the forkserver, worker_forkserver.py, not of this process), taken before the
engine starts and compared after (the resource tracker and the forkserver, which serve
every engine, left out); and killing a list of processes with their children."""

from __future__ import annotations

import contextlib
import multiprocessing

import psutil

from prefillonly_sgl.sglang_runtime import worker_forkserver


class ChildProcesses:
    """This process's children and multiprocessing's record of the processes it started
    (a forked worker is a child of the forkserver, not of this process), at one moment."""

    def __init__(self, pids: set[int], handles: set[int]) -> None:
        self.pids, self.handles = pids, handles

    @classmethod
    def now(cls) -> ChildProcesses:
        return cls(_child_pids(), {p.pid for p in multiprocessing.active_children()})

    def handles_since(self) -> dict[int, multiprocessing.process.BaseProcess]:
        """multiprocessing's handles of the processes started since, by pid."""
        return {p.pid: p for p in multiprocessing.active_children() if p.pid not in self.handles}

    def started_since(self) -> list[psutil.Process]:
        """The processes started since: the engine's workers (not the resource tracker
        or the forkserver, which serve every engine)."""
        later = self.now()
        shared = _tracker_pids() | {worker_forkserver.forkserver_pid()}
        processes = []
        for pid in (later.pids - self.pids - shared) | (later.handles - self.handles):
            with contextlib.suppress(psutil.NoSuchProcess):
                processes.append(psutil.Process(pid))
        return processes


def kill_trees(roots: list[psutil.Process], timeout: float = 60) -> None:
    """Kill each process and its children (those already gone skipped), then wait up to
    ``timeout`` seconds for them to end."""
    victims = []
    for root in roots:
        try:
            victims += root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            continue
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=timeout)


def _child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def _tracker_pids() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if pid else set()
