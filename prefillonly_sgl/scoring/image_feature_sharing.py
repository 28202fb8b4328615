"""Which processed images stay shared between a server's prompts (plain Python).

SGLang hands each prompt's processed image (its pixel rows, ~1.2 MB for a 224x224 photo,
~43 MB for a 1344x1344 page) to the scheduler through a shared-memory segment of its own:
a copy per prompt, which the scheduler unlinks once it has mapped it. A score call's N
prompts carry the query's image N times, so the same pixels were copied N times per call.
Instead one segment per image (keyed by SGLang's content hash) is written once and named
by every prompt that carries the image; the scheduler maps it privately and leaves it, and
the tokenizer process unlinks it when this registry lets it go
(sglang_runtime/shared_image_features.py).

A segment is let go only when a new one needs its room and it has not been named for
``min_idle_s``: by then every prompt that named it was read by the scheduler (which maps a
prompt's images as it receives it, every scheduler loop; a forward takes seconds, not
minutes). Where no old enough segment frees the room, the new image is not shared (SGLang
copies it per prompt, as it ships): never a prompt whose segment is gone.

    registry = SharedSegments(budget_bytes=128 << 20, min_idle_s=600)
    registry.named(key, now)                  # a shared segment's handle, or None
    evicted = registry.admit(key, handle, nbytes, now)   # None: not shared
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

SHARED_IMAGES_BUDGET_BYTES = 128 << 20  # /dev/shm held for processed images, all told
SHARED_IMAGES_MIN_IDLE_S = 600.0  # a segment named this recently is never unlinked


# SGLang names a feature's segment sgl_shm_mm_<creator pid>_<random>
# (utils/stale_shm_cleanup.make_shm_name); ours are written by its own constructor.
FEATURE_SEGMENT_PREFIX = "sgl_shm_mm_"


STALE_AFTER_S = 3600.0  # a dead creator's segment this old is swept


def stale_segments(
    segments: Iterable[tuple[str, float]],
    alive: Callable[[int], bool],
    min_age_s: float = STALE_AFTER_S,
) -> list[str]:
    """The feature segments among ``segments`` ((name, age in seconds)) whose creating
    process is gone and which are older than ``min_age_s``. SGLang stops its processes
    with SIGKILL, so a server's shared images (and SGLang's own segments in flight)
    outlive it in /dev/shm; SGLang sweeps them in its own CI only. The age guards a
    machine whose /dev/shm is shared by containers with pid namespaces of their own
    (docker --ipc=host): another server's live segment looks dead from here, and an hour
    old it was named long ago (that server writes a new one if it is named again:
    sglang_runtime/shared_image_features.py checks a segment is there before naming it)."""
    stale = []
    for name, age in segments:
        if not name.startswith(FEATURE_SEGMENT_PREFIX) or age < min_age_s:
            continue
        parts = name.split("_")
        pid = parts[-2] if len(parts) >= 5 else ""
        if pid.isdigit() and int(pid) > 0 and not alive(int(pid)):
            stale.append(name)
    return stale


@dataclass
class _Entry:
    handle: Any
    nbytes: int
    last_named: float


class SharedSegments:
    """The shared segments of one process, least recently named first."""

    def __init__(
        self,
        budget_bytes: int = SHARED_IMAGES_BUDGET_BYTES,
        min_idle_s: float = SHARED_IMAGES_MIN_IDLE_S,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.min_idle_s = min_idle_s
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()
        self.held_bytes = 0

    def named(self, key, now: float):
        """The handle shared under ``key`` (now named again), or None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.last_named = now
        self._entries.move_to_end(key)
        return entry.handle

    def room_for(self, nbytes: int, now: float) -> list | None:
        """The keys to let go (oldest first) so that ``nbytes`` more fit in the budget, or
        None where they would not fit without letting go of a recently named one."""
        if nbytes > self.budget_bytes:
            return None
        free, evict = self.budget_bytes - self.held_bytes, []
        for key, entry in self._entries.items():
            if free >= nbytes:
                break
            if now - entry.last_named < self.min_idle_s:
                return None  # the rest were named more recently still
            evict.append(key)
            free += entry.nbytes
        return evict if free >= nbytes else None

    def admit(self, key, handle, nbytes: int, now: float) -> list:
        """Shares ``handle`` under ``key``; returns the handles let go to make room (the
        caller unlinks them). Call room_for first: admitting without room is an error."""
        evict = self.room_for(nbytes, now)
        if evict is None:
            raise ValueError(f"no room for {nbytes} bytes of shared images")
        gone = [self.release(k) for k in evict]
        self._entries[key] = _Entry(handle, nbytes, now)
        self.held_bytes += nbytes
        return gone

    def release(self, key):
        """Stops sharing ``key``; its handle (for the caller to unlink)."""
        entry = self._entries.pop(key)
        self.held_bytes -= entry.nbytes
        return entry.handle

    def release_all(self) -> list:
        """Every handle, the registry emptied (at the process's exit)."""
        return [self.release(k) for k in list(self._entries)]

    def handles(self) -> list:
        """Every shared handle, least recently named first."""
        return [entry.handle for entry in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)
