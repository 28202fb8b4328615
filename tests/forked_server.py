"""The suite's servers forked from its forkserver instead of started as new interpreters.

A server started as `python -m prefillonly_sgl serve` imports SGLang's server (~15 s of one
core here) while its forkserver imports SGLang's workers (~15 s of the other): on 2 cores
that is most of a tiny model's start. The suite's forkserver (multiprocessing's, started by
sglang_runtime/worker_forkserver.py for the engines) also imports the server's modules
(conftest.py's ``SERVER_MODULES``), so a server forked from it begins with everything
imported; it then forks its own workers' forkserver from itself (``fork_forkserver_here``),
as imported as it is, and runs the same program the command line would: ``prefillonly_sgl``'s
``__main__`` with ``serve ARGS``, or ``sglang.launch_server`` with its workers forked (stock
SGLang, as tests/stock_sglang_forked.py runs it). Only how the process begins differs: the
code the server runs, its flags, its environment, its logs, its process group (its own
session, as ``start_new_session``) and its exit status are the command line's.
``PREFILLONLY_TEST_SERVERS=exec`` starts every server as a new interpreter instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
from multiprocessing import connection, forkserver, resource_tracker
from multiprocessing import context as mp_context

import setproctitle

from prefillonly_sgl.sglang_runtime import worker_forkserver

# What `serve` and stock SGLang's server import before they start their workers.
SERVER_MODULES = [
    "prefillonly_sgl.cli",
    "sglang.srt.entrypoints.http_server",
    "sglang.launch_server",
]
SERVE = "serve"  # python -m prefillonly_sgl serve ARGS
STOCK = "stock"  # python -m sglang.launch_server ARGS, its workers forked


def fork_forkserver_here() -> None:
    """This process's workers' forkserver, forked from this process.

    Only for a process that has imported SGLang's worker modules and has run no torch
    operation (a process just forked from the suite's forkserver): the forkserver then
    starts as imported as this process, in its process group, instead of importing SGLang
    again in a new interpreter (multiprocessing's way). It is set up as
    ``worker_forkserver.ensure_running`` would find it running: multiprocessing's own
    forkserver record for this process."""
    server = forkserver._forkserver
    address = connection.arbitrary_address("AF_UNIX")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forkserver: it serves until every client has closed alive_w
        code = 1
        try:
            os.close(alive_w)
            worker_forkserver.prepare_forkserver()
            forkserver.main(listener.fileno(), alive_r, [])
            code = 0
        except SystemExit:
            code = 0
        finally:
            os._exit(code)
    listener.close()
    os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


class ForkedServer(mp_context.ForkServerProcess):
    """A server process forked from the suite's forkserver; started as the command line
    would start it (``run``)."""

    def __init__(
        self, program: str, args: list[str], log_path, env: dict, cwd, err_path=None
    ) -> None:
        super().__init__(name=f"forked-{program}")
        self.program, self.args = program, list(args)
        self.env, self.cwd = dict(env), str(cwd)
        self.out_path, self.err_path = str(log_path), str(err_path or log_path)

    def run(self) -> None:
        os.setsid()  # its own process group, as start_new_session: stopped as one
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.env)
        for path, target, flags in (
            (os.devnull, 0, os.O_RDONLY),
            (self.out_path, 1, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
            (self.err_path, 2, os.O_WRONLY | os.O_APPEND | os.O_CREAT),
        ):
            fd = os.open(path, flags, 0o644)
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)  # the forkserver ignores it
        # Its own resource tracker (the suite's is inherited), started with its forkserver.
        resource_tracker._resource_tracker._fd = None
        resource_tracker._resource_tracker._pid = None
        fork_forkserver_here()
        if self.program == SERVE:
            sys.argv = ["prefillonly_sgl", SERVE, *self.args]
            setproctitle.setproctitle(" ".join(["prefillonly", *sys.argv[1:]]))
            runpy.run_module("prefillonly_sgl", run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["sglang.launch_server", *self.args]
            setproctitle.setproctitle(" ".join(["python -m", *sys.argv]))
            with worker_forkserver.workers_started(worker_forkserver.FORKSERVER):
                runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
        sys.stdout.flush()
        sys.stderr.flush()


class ForkedHandle:
    """What the tests use of a subprocess.Popen, for a forked server."""

    def __init__(self, process: ForkedServer) -> None:
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked {self._process.program}", timeout)
        return self._process.exitcode


def enabled() -> bool:
    return os.environ.get("PREFILLONLY_TEST_SERVERS", "fork") != "exec"


def start(program: str, args: list[str], log_path, env: dict, cwd, err_path=None) -> ForkedHandle:
    """A server forked from the forkserver (started if it is not up), in its own process
    group by the time this returns; its stdout to `log_path`, its stderr there too or to
    `err_path`."""
    worker_forkserver.ensure_running()
    process = ForkedServer(program, args, log_path, env, cwd, err_path)
    process.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.exitcode is None:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(process.pid) == process.pid:
                break
        time.sleep(0.01)
    return ForkedHandle(process)


def stop_all() -> None:
    """SIGKILL to the group of every forked server still running (a test that failed
    before its teardown): multiprocessing joins its children at exit."""
    for child in multiprocessing.active_children():
        if isinstance(child, ForkedServer):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.join(10)
