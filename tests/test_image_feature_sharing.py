"""Which processed images stay shared between a server's prompts
(scoring/image_feature_sharing.py, plain Python): a budget of bytes, least recently named
let go first, and never one named within min_idle_s (a prompt naming it may not have been
read yet): then the new image is not shared."""

from __future__ import annotations

import pytest

from prefillonly_sgl.scoring.image_feature_sharing import SharedSegments, stale_segments

MB = 1 << 20


def test_an_image_is_written_once_and_named_after():
    registry = SharedSegments(budget_bytes=10 * MB, min_idle_s=60)
    assert registry.named("photo", now=0) is None
    assert registry.room_for(4 * MB, now=0) == []
    assert registry.admit("photo", "segment", 4 * MB, now=0) == []
    assert registry.named("photo", now=1) == "segment"
    assert (len(registry), registry.held_bytes) == (1, 4 * MB)


def test_room_is_made_from_the_least_recently_named_idle_ones():
    registry = SharedSegments(budget_bytes=10 * MB, min_idle_s=60)
    registry.admit("a", "A", 4 * MB, now=0)
    registry.admit("b", "B", 4 * MB, now=10)
    registry.named("a", now=20)  # a is now the most recently named
    assert registry.admit("c", "C", 4 * MB, now=100) == ["B"]  # b idle 90 s: let go
    assert registry.named("b", now=101) is None and registry.named("a", now=101) == "A"
    assert registry.held_bytes == 8 * MB


def test_a_recently_named_image_is_never_let_go_and_the_new_one_is_not_shared():
    registry = SharedSegments(budget_bytes=10 * MB, min_idle_s=60)
    registry.admit("a", "A", 6 * MB, now=0)
    assert registry.room_for(6 * MB, now=30) is None  # a named 30 s ago: maybe unread
    with pytest.raises(ValueError, match="no room"):
        registry.admit("b", "B", 6 * MB, now=30)
    assert registry.room_for(11 * MB, now=1000) is None  # larger than the budget
    assert registry.room_for(6 * MB, now=61) == ["a"]


def test_release_all_hands_back_every_segment():
    registry = SharedSegments(budget_bytes=10 * MB, min_idle_s=60)
    registry.admit("a", "A", MB, now=0)
    registry.admit("b", "B", MB, now=0)
    assert registry.release_all() == ["A", "B"]
    assert (len(registry), registry.held_bytes) == (0, 0)


def test_segments_of_dead_creators_are_stale():
    alive = {100}.__contains__
    segments = [
        ("sgl_shm_mm_100_ab12cd34", 7200),  # its creator runs
        ("sgl_shm_mm_200_ab12cd34", 7200),  # dead: stale
        ("sgl_shm_mm_300_ab12cd34", 60),  # looks dead, but recent: maybe another
        # pid namespace's live segment (a /dev/shm shared across containers)
        ("sgl_shm_other_200_ab12cd34", 7200),  # not a feature segment
        ("sem.loky-200-x", 7200),
        ("sgl_shm_mm_x_ab12cd34", 7200),  # no pid
    ]
    assert stale_segments(segments, alive, min_age_s=3600) == ["sgl_shm_mm_200_ab12cd34"]


def test_the_sweep_unlinks_what_a_killed_server_left(tmp_path):
    """A real folder: an old segment of a process that has exited goes; a live one's, a
    recent one and other files stay (shared_image_features.sweep_stale_segments)."""
    import os
    import subprocess
    import sys

    from prefillonly_sgl.sglang_runtime.shared_image_features import sweep_stale_segments

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead, live = int(done.stdout), os.getpid()
    for name in (f"sgl_shm_mm_{dead}_0badf00d", f"sgl_shm_mm_{live}_0badf00d", "other"):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (0, 0))  # written long ago
    (tmp_path / f"sgl_shm_mm_{dead}_00c0ffee").write_bytes(b"x")  # just now: stays
    assert sweep_stale_segments(tmp_path) == [f"sgl_shm_mm_{dead}_0badf00d"]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {f"sgl_shm_mm_{live}_0badf00d", "other", f"sgl_shm_mm_{dead}_00c0ffee"}
