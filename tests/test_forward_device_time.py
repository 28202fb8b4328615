"""The forward log's device time (issue 83, item 1): on CUDA each extend forward's line
carries `device_ms`, read from two timing events once the device has passed the second
(event.query()), never by waiting on the hot path; lines are held until then, written in
launch order, once each, and all flushed when the scheduler goes idle. On a CPU (no
events) every line is written at once, as before, without device_ms.

CUDA cannot run here: its events are stood in by a class whose query() answers what a
simulated device has finished, and whose synchronize() is recorded (the hot path must
never call it). The last test reads a real CPU engine's forward log.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import start_logging_forwards

from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.sglang_runtime.forward_profile import scheduler_process as sp
from prefillonly_sgl.sglang_runtime.forward_profile.device_time import HeldForwards


class Device:
    """A simulated device: events complete when it has run past them."""

    def __init__(self) -> None:
        self.recorded = 0  # events recorded so far, in stream order
        self.finished = 0  # how many of them have completed
        self.syncs: list[int] = []  # every synchronize() (on the hot path: none)
        self.streams: list = []

    def run_all(self) -> None:
        self.finished = self.recorded


class FakeEvent:
    device: Device

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.seq = None

    def record(self, stream=None) -> None:
        self.device.recorded += 1
        self.seq = self.device.recorded
        self.device.streams.append(stream)

    def query(self) -> bool:
        return self.seq is not None and self.seq <= self.device.finished

    def synchronize(self) -> None:
        self.device.syncs.append(self.seq)
        self.device.finished = max(self.device.finished, self.seq)

    def elapsed_time(self, end) -> float:
        assert self.query() and end.query(), "elapsed_time before both events completed"
        return 1.5 * (end.seq - self.seq)


def _event_pair(device):
    start, end = FakeEvent(True), FakeEvent(True)
    start.device = end.device = device
    start.record()
    end.record()
    return start, end


def test_held_lines_are_written_once_in_order_when_their_forward_ends(tmp_path):
    path = str(tmp_path / "forwards.log")
    device = Device()
    FakeEvent.device = device
    held = HeldForwards()
    for i in range(3):
        held.hold(path, {"new": [i]}, *_event_pair(device))
    assert held.write_completed() == 0 and read_events(path) == []
    device.finished = 2  # the first forward's end event (its 2nd) has completed
    assert held.write_completed() == 1
    device.finished = 6
    assert held.write_completed() == 2 and held.write_completed() == 0
    lines = read_events(path, "forward")
    assert [line["new"] for line in lines] == [[0], [1], [2]]
    assert [line["device_ms"] for line in lines] == [1.5] * 3
    assert device.syncs == [] and len(held) == 0


def test_a_line_waits_behind_an_older_one(tmp_path):
    """Order is launch order: a later forward's event cannot overtake an earlier one on
    one stream, but should one report done first, its line still waits."""
    path = str(tmp_path / "forwards.log")
    device = Device()
    held = HeldForwards()
    first, second = _event_pair(device), _event_pair(device)
    held.hold(path, {"new": [1]}, *first)
    held.hold(path, {"new": [2]}, *second)
    second[1].query = lambda: True  # out of order
    assert held.write_completed() == 0
    device.run_all()
    assert held.write_completed() == 2
    assert [line["new"] for line in read_events(path)] == [[1], [2]]


def test_flush_waits_and_writes_every_line(tmp_path):
    path = str(tmp_path / "forwards.log")
    device = Device()
    held = HeldForwards()
    for i in range(2):
        held.hold(path, {"new": [i]}, *_event_pair(device))
    assert held.flush() == 2 and len(held) == 0
    assert device.syncs == [2, 4]  # each line's end event, at idle
    assert [line["device_ms"] for line in read_events(path)] == [1.5, 1.5]


def test_a_broken_event_still_writes_its_line(tmp_path):
    path = str(tmp_path / "forwards.log")
    device = Device()
    held = HeldForwards()
    start, end = _event_pair(device)

    def broken(_end):
        raise RuntimeError("event never recorded")

    start.elapsed_time = broken
    held.hold(path, {"new": [3]}, start, end)
    device.run_all()
    assert held.write_completed() == 1
    (line,) = read_events(path)
    assert line["new"] == [3] and "device_ms" not in line


# -- the scheduler hooks, with a stand-in scheduler and CUDA's events stood in --------
class Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.waited_for: list[str] = []

    def wait_stream(self, other) -> None:
        self.waited_for.append(other.name)


def _batch(new):
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_extend=lambda: True),
        reqs=[object() for _ in new],
        prefix_lens=[0] * len(new),
        extend_lens=list(new),
    )


@pytest.fixture
def forward_log(tmp_path, monkeypatch):
    path = tmp_path / "forwards.log"
    state = process_state.current()
    monkeypatch.setattr(
        state,
        "switches",
        dataclasses.replace(state.switches, forward_log=str(path), forward_profile=None),
    )
    monkeypatch.setattr(sp, "_HELD", HeldForwards())
    monkeypatch.setattr(sp, "_exit_flush", {"registered": True})  # no atexit in a test
    return path


def test_cuda_scheduler_holds_lines_and_never_syncs_on_the_hot_path(forward_log, monkeypatch):
    """run_batch records a start and an end event on the forward stream (after its wait
    for the schedule stream, as SGLang's overlapped run_batch does), the line is held
    while the forward runs, written after a later step or batch result once its end event
    has completed, and whatever is left is flushed at idle; t is the launch time."""
    device = Device()
    FakeEvent.device = device
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    forward, schedule = Stream("forward"), Stream("schedule")
    scheduler = SimpleNamespace(
        device="cuda", enable_overlap=True, forward_stream=forward, schedule_stream=schedule
    )
    launched = []

    def run_batch(self, batch):
        launched.append(time.time())
        assert device.recorded == 2 * len(launched) - 1  # the start event is recorded
        return f"result {len(launched)}"

    assert sp._around_run_batch(run_batch, scheduler, _batch([5, 3])) == "result 1"
    assert forward.waited_for == ["schedule"] and device.streams == [forward, forward]
    assert not forward_log.exists()  # held: the device has not run it
    sp._around_run_batch(run_batch, scheduler, _batch([7]))  # overlapped: first still runs
    assert not forward_log.exists()
    device.finished = 2  # the first forward's end event has completed
    sp._after_process_batch_result(None, scheduler, _batch([5, 3]), None)
    (first,) = read_events(forward_log, "forward")
    assert first["new"] == [5, 3] and first["device_ms"] == 1.5
    assert first["t"] <= launched[0] + 1e-3 and first["step_s"] >= 0
    assert device.syncs == []  # run_batch and the result hook never waited
    sp._before_on_idle(scheduler)  # idle: the second forward's line, waiting on its end
    lines = read_events(forward_log, "forward")
    assert [line["new"] for line in lines] == [[5, 3], [7]]
    assert device.syncs == [4] and len(sp._HELD) == 0
    sp._before_on_idle(scheduler)  # nothing held: nothing written twice
    assert len(read_events(forward_log, "forward")) == 2


def test_without_overlap_the_events_go_on_the_current_stream(forward_log, monkeypatch):
    device = Device()
    FakeEvent.device = device
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    current = Stream("current")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    scheduler = SimpleNamespace(device="cuda", enable_overlap=False, forward_stream=None)
    sp._around_run_batch(lambda self, batch: None, scheduler, _batch([4]))
    assert device.streams == [current, current] and current.waited_for == []
    device.run_all()
    sp._around_run_batch(  # a decode step: no line of its own, but the held one goes
        lambda self, batch: None,
        scheduler,
        SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: False)),
    )
    (line,) = read_events(forward_log, "forward")
    assert line["new"] == [4] and line["device_ms"] == 1.5 and device.syncs == []


def test_cpu_scheduler_writes_each_line_at_once_without_device_time(forward_log, monkeypatch):
    def no_events(*args, **kwargs):
        raise AssertionError("no CUDA event on a CPU")

    monkeypatch.setattr(torch.cuda, "Event", no_events)
    scheduler = SimpleNamespace(device="cpu")
    before = time.time()
    sp._around_run_batch(lambda self, batch: None, scheduler, _batch([2, 2]))
    (line,) = read_events(forward_log, "forward")
    assert set(line) == {"event", "prefix", "new", "packed", "step_s", "t"}
    assert before - 1e-3 <= line["t"] <= time.time() and len(sp._HELD) == 0


# -- a real CPU engine's forward log --------------------------------------------------
@pytest.fixture(scope="module")
def engine_with_log(tiny_llama_path, tmp_path_factory):
    from prefillonly_sgl import Engine

    log = tmp_path_factory.mktemp("forward-log") / "forwards.log"
    engine = start_logging_forwards(
        log,
        lambda: Engine(tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=4096),
    )
    with engine:
        yield engine, log


def test_a_cpu_engines_forward_log_counts_each_forward_once(engine_with_log, yes_no_labels):
    """A cold query and its items: one forward (the followers packed behind their
    leader); the same call again: one more, every item behind the cached query. Each line
    at once (no device time on a CPU), launched within the call."""
    engine, log = engine_with_log
    query, items = list(range(20, 120)), [[130, 131], [140, 141, 142], [150]]
    for round_ in range(2):
        before = len(read_events(log, "forward"))
        start = time.time()
        engine.score(query, items, yes_no_labels)
        forwards = read_events(log, "forward")[before:]
        assert len(forwards) == 1
        (line,) = forwards
        assert set(line) == {"event", "prefix", "new", "packed", "step_s", "t"}
        assert start <= line["t"] <= time.time() and line["step_s"] > 0
        assert line["packed"] == (2 if round_ == 0 else 0)
        assert sum(line["new"]) == (len(query) if round_ == 0 else 0) + sum(map(len, items))
