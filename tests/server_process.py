"""Start `prefillonly serve` as a real subprocess on localhost for the server tests.

The server runs in its own process group (SGLang adds a scheduler, a detokenizer and a
resource tracker), so a test can stop all of it and check that nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import forked_server
import requests
import start_counts

from prefillonly_sgl.machine.ports import free_port

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300  # SGLang's workers import for ~15-40 s on a busy 2-core machine


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefillonly_sgl", "serve", *args]


def serve_env() -> dict:
    # This checkout's package first (the environment may have another one installed).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


STOCK_SGLANG_SERVER = [sys.executable, str(REPO / "tests" / "stock_sglang_forked.py")]


def stock_sglang_command(*args: str) -> list[str]:
    """SGLang's own server (`python -m sglang.launch_server`, its workers forked:
    stock_sglang_forked.py), torch_native attention (the CPU backend stock SGLang runs
    here): the reference a test compares ours with."""
    return [*STOCK_SGLANG_SERVER, *args, "--attention-backend", "torch_native"]


def forked_program(argv: list[str]) -> tuple[str | None, list[str]]:
    """The program a server's command line runs, as tests/forked_server.py forks it
    (`serve`'s or stock SGLang's, and its arguments); (None, argv) for another."""
    for prefix, program in (
        (serve_command(), forked_server.SERVE),
        (STOCK_SGLANG_SERVER, forked_server.STOCK),
    ):
        if argv[: len(prefix)] == prefix:
            return program, argv[len(prefix) :]
    return None, argv


def run_command(argv: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(argv, capture_output=True, text=True) in this checkout's
    environment, for a command that may not start a server (`serve --help`, a start
    refused): forked as the servers are where it is `serve`'s or stock SGLang's."""
    program, program_args = forked_program(argv)
    if program is None or not forked_server.enabled():
        return subprocess.run(argv, cwd=REPO, env=serve_env(), capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        handle = forked_server.start(program, program_args, out, serve_env(), REPO, err)
        try:
            code = handle.wait(timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(handle.pid, signal.SIGKILL)
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


class ServerProcess:
    def __init__(
        self, model_path: Path, log_path: Path, *extra_args: str, command=serve_command
    ) -> None:
        start_counts.count("server")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [
            "--model-path", str(model_path),
            "--device", "cpu",
            "--dtype", "float32",
            "--max-total-tokens", "4096",
            "--skip-server-warmup",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *extra_args,
        ]  # fmt: skip
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        program, program_args = forked_program(command(*args))
        if program is not None and forked_server.enabled():
            # The same program, forked already imported (tests/forked_server.py).
            self.proc = forked_server.start(program, program_args, log_path, serve_env(), REPO)
            return
        self.proc = subprocess.Popen(
            command(*args),
            cwd=REPO,
            env=serve_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: pgid == pid
        )

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise TimeoutError(f"server not healthy after {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def wait_group_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.poll()
            if not self.group_alive():
                return True
            time.sleep(0.2)
        return False

    def stop(self, graceful: bool = True) -> None:
        """SIGTERM to the server's group (SGLang drains, then stops its workers: up to
        ~7 s, its drain watchdog polls every 5 s), SIGKILL after 60 s; or, not graceful,
        SIGKILL to the whole group at once (a fixture's teardown: every process of the
        server, its workers and forkserver included, is in the group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        if not self.wait_group_gone(60):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.wait_group_gone(10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._log.close()


@contextlib.contextmanager
def running_server(model_path: Path, log_path: Path, *extra_args: str, command=serve_command):
    server = ServerProcess(model_path, log_path, *extra_args, command=command)
    try:
        server.wait_ready()
        yield server
    finally:
        # SIGTERM's drain is tested where it is named (test_server_load.py)
        server.stop(graceful=False)
