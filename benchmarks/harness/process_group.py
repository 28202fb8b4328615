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


def start_in_group(command: list[str], output=None, cwd=None) -> subprocess.Popen:
    """Starts `command` in a process group of its own (see run_in_group) and returns at
    once; end it with end_group."""
    return subprocess.Popen(
        command,
        start_new_session=True,
        stdout=output,
        stderr=subprocess.STDOUT if output is not None else None,
        cwd=cwd,
    )


def end_group(child: subprocess.Popen, seconds: float) -> int | None:
    """Waits up to `seconds` for a child of start_in_group, then kills it with its group.
    Returns its exit code, None when it was killed."""
    try:
        return child.wait(timeout=max(0.0, seconds))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()
        return None
