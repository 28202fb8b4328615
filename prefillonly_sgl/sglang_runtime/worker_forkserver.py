"""An Engine's workers forked from a process that has SGLang imported (opt-in, CPU).

SGLang starts its scheduler and detokenizer with multiprocessing "spawn": each worker is a
new interpreter that imports torch, transformers and SGLang before it does anything, 14 of
a tiny model's ~18 s start on a 2-core CPU. With ``PREFILLONLY_WORKER_START=forkserver``
(machine/environment.py), an Engine's workers are forked instead from multiprocessing's
forkserver, a process of the caller that imported SGLang's worker modules once
(worker_forkserver_preload.py): the first Engine starts as before, every later one in the
same process ~4 s. For processes that start many engines (a test suite, a notebook); the
forkserver stays up, idle, until the caller exits.

A forked worker must start as a spawned one would, so each one carries from the caller,
at its start:
- the environment (a spawned worker inherits it; the forkserver's is older): it carries
  the runtime configuration to the plugin, which SGLang loads in the worker
  (load_plugins() in run_scheduler_process), after the environment is restored;
- the caller's stdout and stderr (WorkerOutput reads the workers' errors from fd 2);
- SIGQUIT's default action (the forkserver ignores it: SGLang's workers signal their
  failure to their parent process, which is now the forkserver, and that signal must not
  end it and every other engine's workers with it).

SGLang's engine module takes its Process and Pipe from its global ``mp`` (the
multiprocessing module), and calls ``mp.set_start_method("spawn", force=True)`` at each
start: while such an Engine starts, that global is a forkserver context whose
set_start_method does nothing (hook target ``sglang.srt.entrypoints.engine.mp``). The
workers are then children of the forkserver, not of the caller: owned_processes.py finds
them through multiprocessing's own record of the processes it started (``active_children``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing import context as mp_context
from multiprocessing import forkserver, reduction

from prefillonly_sgl.machine import environment

SPAWN = "spawn"
FORKSERVER = "forkserver"
MODES = (SPAWN, FORKSERVER)
PRELOAD_MODULE = "prefillonly_sgl.sglang_runtime.worker_forkserver_preload"

_swap_lock = threading.Lock()


def check_mode(mode: str | None) -> str:
    """The worker start mode, SGLang's spawn unless named."""
    if mode is None:
        return SPAWN
    if mode not in MODES:
        raise ValueError(f"PREFILLONLY_WORKER_START={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def start_mode() -> str:
    """The worker start mode this process asked for (PREFILLONLY_WORKER_START), with the
    forkserver started if it is that one. Called by the Engine and `serve` before the
    runtime configuration enters the environment: the forkserver keeps the environment it
    starts with and serves every engine of the process."""
    mode = check_mode(environment.read(environment.WORKER_START))
    if mode == FORKSERVER:
        ensure_running()
    return mode


def ensure_running() -> None:
    """Start the forkserver (with SGLang's worker modules imported) if it is not up.

    Called before the runtime configuration enters the environment and before the
    workers' stderr is redirected: the forkserver keeps the environment and descriptors
    it starts with, and neither belongs to one engine."""
    if forkserver._forkserver._forkserver_pid is None:
        # Ours first, then any the caller asked multiprocessing for (the test suite's
        # servers: tests/forked_server.py).
        others = [m for m in forkserver._forkserver._preload_modules if m != PRELOAD_MODULE]
        multiprocessing.set_forkserver_preload([PRELOAD_MODULE, *others])
    forkserver.ensure_running()


def prepare_forkserver() -> None:
    """The forkserver's own set-up, before it forks any worker (its preload module runs it).

    It ignores SIGQUIT: SGLang's workers send it to their parent when they fail, and the
    forkserver's end would take every engine's workers with it (they die with their
    parent: SGLang sets PR_SET_PDEATHSIG in them); ForkedWorker restores the default
    action in each worker. And it is named in `ps`, with setproctitle set up here, on
    this process's own argv and environ memory: a worker that first sets its title after
    ForkedWorker rewrote its environment finds that memory moved and keeps the
    forkserver's command line as its title, while SGLang's workers are known by their
    titles (sglang::scheduler, WorkerWatch's messages)."""
    import setproctitle

    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    setproctitle.setproctitle("prefillonly::worker_forkserver")


class _ParentStdio:
    """The caller's fds 1 and 2 at a worker's start, passed to the forked worker (as
    spawn passes them by inheritance); pickled only while the worker is being started."""

    def __init__(self, out_fd: int | None = None, err_fd: int | None = None) -> None:
        self.out_fd, self.err_fd = out_fd, err_fd

    def __reduce__(self):
        # During pickling for the forkserver: DupFd hands the descriptors to the child.
        return (_ParentStdio._in_child, (reduction.DupFd(1), reduction.DupFd(2)))

    @staticmethod
    def _in_child(out_dup, err_dup) -> _ParentStdio:
        return _ParentStdio(out_dup.detach(), err_dup.detach())

    def install(self) -> None:
        for fd, target in ((self.out_fd, 1), (self.err_fd, 2)):
            if fd is not None:
                os.dup2(fd, target)
                os.close(fd)


class ForkedWorker(mp_context.ForkServerProcess):
    """A worker process started from the forkserver, as if spawned by the caller."""

    def start(self) -> None:
        self._caller_environ = dict(os.environ)
        self._caller_stdio = _ParentStdio()
        super().start()

    def run(self) -> None:
        os.environ.clear()
        os.environ.update(self._caller_environ)
        self._caller_stdio.install()
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        super().run()


class _ForkServerMultiprocessing:
    """What SGLang's engine module uses of ``multiprocessing`` (its ``mp``), with workers
    forked from the forkserver; anything else is the module's own."""

    Process = ForkedWorker

    def set_start_method(self, method, force=False) -> None:
        """SGLang's "spawn" for every later process of the caller: not changed here."""

    def __getattr__(self, name):
        return getattr(multiprocessing, name)


@contextlib.contextmanager
def workers_started(mode: str):
    """While an Engine starts: its workers started the ``mode`` way. One Engine at a time
    swaps SGLang's global (two threads starting engines take turns here)."""
    if mode == SPAWN:
        yield
        return
    from sglang.srt.entrypoints import engine as engine_module

    with _swap_lock:
        original = engine_module.mp
        engine_module.mp = _ForkServerMultiprocessing()
        try:
            yield
        finally:
            engine_module.mp = original


def forkserver_pid() -> int | None:
    """The forkserver's pid where this process started one (it is a child of the caller
    that no engine owns)."""
    return forkserver._forkserver._forkserver_pid
