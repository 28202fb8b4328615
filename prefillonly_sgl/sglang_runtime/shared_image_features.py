"""One shared-memory segment per processed image for every prompt that carries it (the
tokenizer process; which segments stay: scoring/image_feature_sharing.py).

SGLang sends each prompt's processed image to the scheduler in a shared-memory segment of
the prompt's own (mm_utils.wrap_shm_features in TokenizerManager._send_one_request: a
segment allocated and the pixels copied, ~0.85 ms for a 224x224 photo on a CPU core), which
the scheduler unlinks as it maps it. The N prompts of a score call about one image (the
query's, from SGLang's preprocess cache: one tensor, one content hash) made N copies. Here,
before SGLang wraps a prompt's features, an image already shared under its hash is named
by a SharedImageFeature (a ShmPointerMMData that the scheduler maps privately, copy on
write as SGLang's own, and closes without unlinking); a new one is written into a segment
once, if the registry has room. SGLang wraps what is left as it ships.

On a TokenizerManager marked by share_images (ScoringFront: where prefill-only KV runs;
stock engines in the same process keep SGLang's per-prompt copies), with SGLang's
shared-memory transport on (its default transport pickles features instead: then nothing
is done here). A segment is unlinked by this process: when the registry lets it go, when
its Engine shuts down (release_shared_images) and at exit; a server stopped with SIGKILL
(as SGLang stops its processes) leaves them, and the next engine of the machine sweeps
the segments whose creator is dead (sweep_stale_segments).
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

import torch
from sglang.srt.managers.mm_utils import ShmPointerMMData

from prefillonly_sgl.scoring.image_feature_sharing import SharedSegments, stale_segments

SHARES_IMAGES = "_prefillonly_shares_images"  # a TokenizerManager's registry, or absent


class SharedImageFeature(ShmPointerMMData):
    """A pointer to an image's segment that several prompts name: a reader closes its
    handle and leaves the segment (ShmPointerMMData unlinks it once mapped), which the
    tokenizer process unlinks (unlink())."""

    def close_and_unlink(self) -> None:  # called by materialize() and discard
        handle = self._shm_handle
        self._shm_handle = None
        self.tensor = None
        if handle is not None:
            handle.close()

    def unlink(self) -> None:
        from multiprocessing import shared_memory

        try:
            segment = shared_memory.SharedMemory(name=self.shm_name)
        except FileNotFoundError:
            return
        segment.close()
        segment.unlink()


def share_images(tokenizer_manager, on: bool) -> None:
    """Whether this TokenizerManager's prompts share their images' segments (the
    ScoringFront decides, once). The first in a process sweeps the segments that killed
    processes left in /dev/shm."""
    if on and not hasattr(tokenizer_manager, SHARES_IMAGES):
        _sweep_once()
        registry = SharedSegments()
        _registries.append(registry)  # unlinked at exit
        setattr(tokenizer_manager, SHARES_IMAGES, registry)
    elif not on and hasattr(tokenizer_manager, SHARES_IMAGES):
        release_shared_images(tokenizer_manager)
        _registries.remove(getattr(tokenizer_manager, SHARES_IMAGES))
        delattr(tokenizer_manager, SHARES_IMAGES)


def release_shared_images(tokenizer_manager) -> None:
    """Unlinks every segment this TokenizerManager shares (its engine is shut down)."""
    registry = getattr(tokenizer_manager, SHARES_IMAGES, None)
    if registry is not None:
        for pointer in registry.release_all():
            pointer.unlink()


_registries: list[SharedSegments] = []  # every registry of this process, for its exit
_swept = False
SHM_DIR = Path("/dev/shm")  # where Linux keeps POSIX shared memory


def _sweep_once() -> None:
    global _swept
    if _swept or not SHM_DIR.is_dir():
        return
    _swept = True
    sweep_stale_segments(SHM_DIR)


def sweep_stale_segments(folder: Path) -> list[str]:
    """Unlinks the feature segments in ``folder`` whose creator is dead
    (image_feature_sharing.stale_segments); returns their names."""
    now = time.time()
    stale = stale_segments(((p.name, now - _mtime(p)) for p in folder.iterdir()), _alive)
    for name in stale:
        (folder / name).unlink(missing_ok=True)
    return stale


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # gone meanwhile
        return time.time()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@atexit.register
def _unlink_at_exit() -> None:
    for registry in _registries:
        for pointer in registry.release_all():
            pointer.unlink()


def _shares(tokenizer_manager) -> SharedSegments | None:
    from sglang.srt.managers.mm_utils import _get_is_default_transport
    from sglang.srt.runtime_context import get_serving

    registry = getattr(tokenizer_manager, SHARES_IMAGES, None)
    if registry is None or _get_is_default_transport() or get_serving().skip_tokenizer_init:
        return None  # not ours, or SGLang sends features pickled (nothing to share)
    if not SHM_DIR.is_dir():
        return None  # segments are checked and swept where Linux keeps them
    return registry


def _share(registry: SharedSegments, item, now: float) -> None:
    """The item's feature named by its image's shared segment, written first if new and
    there is room; left to SGLang otherwise."""
    feature = item.feature
    if (
        item.hash is None
        or not isinstance(feature, torch.Tensor)
        or not feature.is_cpu
        or item.precomputed_embeddings is not None
    ):
        return
    key = (item.hash, tuple(feature.shape), feature.dtype)
    pointer = registry.named(key, now)
    if pointer is not None and not (SHM_DIR / pointer.shm_name).exists():
        registry.release(key)  # unlinked from outside (another namespace's sweep)
        pointer = None
    if pointer is None:
        nbytes = feature.numel() * feature.element_size()
        if registry.room_for(nbytes, now) is None:
            return
        try:
            pointer = SharedImageFeature(feature, precomputed_hash=item.hash)
        except OSError:  # /dev/shm full: SGLang falls back to pickling it, as it would
            return
        for gone in registry.admit(key, pointer, nbytes, now):
            gone.unlink()
    item.feature = pointer


async def _around_send_one_request(original, self, tokenized_obj, *args, **kwargs):
    registry = _shares(self)
    mm_inputs = getattr(tokenized_obj, "mm_inputs", None)
    if registry is not None and mm_inputs is not None:
        now = time.monotonic()
        for item in mm_inputs.mm_items:
            _share(registry, item, now)
    return await original(self, tokenized_obj, *args, **kwargs)


HOOKS = {
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request": (
        "AROUND",
        _around_send_one_request,
    ),
}
