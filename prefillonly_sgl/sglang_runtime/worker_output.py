"""The workers' stderr while an offline Engine of ours runs: SGLang's workers inherit the
caller's fd 2, so while they start it is a pipe to a thread that passes every line on to
the caller's stderr and keeps the last ones, from which the start error
(offline_engine.start_failure_message) and a later death (worker_watch.WorkerWatch) take
the worker's last exception line (a worker's traceback is only ever written there)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import threading


class WorkerOutput:
    """The workers' stderr (they inherit this process's fd 2 when spawned): passed on to
    this process's stderr as it comes, its last lines kept for the error messages (a
    worker's traceback is only ever written there)."""

    _EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")

    def __init__(self) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=500)
        self._count = 0
        self._started_at = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def capturing(self):
        """fd 2 is a pipe to the pump thread while the workers are spawned."""
        read_fd, write_fd = os.pipe()
        stderr_fd = os.dup(2)
        pump = threading.Thread(
            target=self._pump, args=(read_fd, stderr_fd), daemon=True, name="sglang-stderr"
        )
        pump.start()
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(stderr_fd, 2)
            os.close(write_fd)  # the workers hold their own copies

    def _pump(self, read_fd: int, stderr_fd: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_fd, 65536):
                with contextlib.suppress(OSError):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(stderr_fd, view) :]
                *lines, pending = (pending + chunk).split(b"\n")
                with self._lock:
                    for line in lines:
                        self._lines.append(line.decode(errors="replace").rstrip())
                        self._count += 1
        finally:  # every worker has exited
            os.close(read_fd)
            os.close(stderr_fd)

    def mark_started(self) -> None:
        """Lines written before now are the start's, not a later death's."""
        with self._lock:
            self._started_at = self._count

    def last_error_line(self) -> str | None:
        """The last exception line (``ValueError: ...``) since start, or since the
        engine started once it has."""
        with self._lock:
            fresh = list(self._lines)[max(0, len(self._lines) - (self._count - self._started_at)) :]
        for line in reversed(fresh):
            if self._EXCEPTION_LINE.match(line):
                return line[:1000]
        return None
