"""A child process in a process group of its own (the card scripts' parts and checks)."""

from __future__ import annotations

import os
import signal
import subprocess


def run_in_group(command: list[str], limit: float, output=None, cwd=None) -> int | None:
    """Runs `command` in a process group of its own: one that runs past `limit` seconds (a
    hung engine) is killed with its engine's workers, which hold the card, and so is one
    the user interrupts. output: a file for its stdout and stderr (default: ours).
    Returns its exit code, None when it was killed at the limit."""
    child = subprocess.Popen(
        command,
        start_new_session=True,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        cwd=cwd,
    )
    try:
        return child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return None
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        raise
