"""Device time per forward for the forward log, without a host-device sync on the hot path
(plain Python: the events are handed in, CUDA's or a test's stand-in).

The scheduler hook records a timing event on the forward's stream before and after the
forward (scheduler_process._around_run_batch) and hands the forward's line here with both
events. A line is held until its end event has completed: `write_completed` (called at
each later run_batch and after each batch's results are processed) asks each held
forward's end event `query()`, oldest first, and writes those that are done with
`device_ms = start.elapsed_time(end)`; it never waits. `flush` (the scheduler idle, or the
process exiting) waits on each held end event and writes every line. Lines are written in
the order their forwards were launched: the events of one stream complete in that order,
and a line waits behind an older one that is still held.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from prefillonly_sgl.hooking.events import append_event


class TimingEvent(Protocol):
    """What torch.cuda.Event(enable_timing=True) offers that this module uses."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event) -> float: ...


class HeldForwards:
    """Forward-log lines waiting for their forward's end event, oldest first."""

    def __init__(self) -> None:
        self._lines: deque[tuple[str, dict, TimingEvent, TimingEvent]] = deque()

    def __len__(self) -> int:
        return len(self._lines)

    def hold(self, path: str, fields: dict, start: TimingEvent, end: TimingEvent) -> None:
        self._lines.append((path, fields, start, end))

    def write_completed(self) -> int:
        """Writes the held lines whose forward has ended on the device, oldest first,
        stopping at the first that has not (query() only: never waits). How many."""
        written = 0
        while self._lines and self._lines[0][3].query():
            self._write(*self._lines.popleft())
            written += 1
        return written

    def flush(self) -> int:
        """Writes every held line, waiting for each forward's end event (at idle or exit,
        where waiting costs nothing). How many."""
        written = 0
        while self._lines:
            path, fields, start, end = self._lines.popleft()
            try:
                end.synchronize()
            except Exception:  # a broken device: the line still goes, without device_ms
                append_event(path, "forward", **fields)
            else:
                self._write(path, fields, start, end)
            written += 1
        return written

    @staticmethod
    def _write(path: str, fields: dict, start: TimingEvent, end: TimingEvent) -> None:
        try:
            device_ms = round(float(start.elapsed_time(end)), 4)
        except Exception:  # an event never recorded: the line without device_ms
            append_event(path, "forward", **fields)
            return
        append_event(path, "forward", **fields, device_ms=device_ms)
