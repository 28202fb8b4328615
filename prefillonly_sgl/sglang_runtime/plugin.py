"""SGLang plugin entry point (group ``sglang.srt.plugins``, declared in pyproject.toml).

SGLang calls ``load_plugin()`` in every process it starts (the main process, the
scheduler, the detokenizer), which is how the runtime patches reach the spawned workers.

The plugin is installed for the whole environment, so a stock ``python -m
sglang.launch_server`` in the same .venv would load it too. It therefore does nothing
unless the process was started by prefillonly (``prefillonly_sgl.Engine`` or ``prefillonly
serve``), which sets PATCHES_ENV to the comma-separated features to apply; spawned workers
inherit the variable. Stock SGLang stays stock, which the benchmarks rely on.
"""

from __future__ import annotations

import contextlib
import logging
import os

from prefillonly_sgl import features
from prefillonly_sgl.sglang_runtime.forward_profile import PROFILE_ENV
from prefillonly_sgl.sglang_runtime.memory_probe import PROBE_ENV

logger = logging.getLogger(__name__)

PATCHES_ENV = "PREFILLONLY_PATCHES"

# Instruments: measuring hooks, installed (whatever the features) in a prefillonly engine
# whose environment sets their variable: only prefillonly's own calibration runs do.
INSTRUMENTS: dict[str, str] = {
    PROBE_ENV: "prefillonly_sgl.sglang_runtime.memory_probe:register",
    PROFILE_ENV: "prefillonly_sgl.sglang_runtime.forward_profile:register",
}


def requested_features(environ=os.environ) -> list[str]:
    raw = environ.get(PATCHES_ENV, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    return features.check_known(names, f"features in {PATCHES_ENV}")


@contextlib.contextmanager
def patches_enabled(names: list[str], settings: dict[str, str] | None = None):
    """Set PATCHES_ENV to `names` (and the features' `settings` variables) while SGLang
    starts (its spawned workers inherit the environment), then restore them, so a later
    stock engine in this process stays stock."""
    features.check_known(names, "runtime patches")
    values = {PATCHES_ENV: ",".join(names), **(settings or {})}
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load_plugin() -> None:
    import importlib
    import multiprocessing

    if PATCHES_ENV in os.environ and multiprocessing.parent_process() is not None:
        _thread_lock_for_progress_bars()  # a worker of an engine prefillonly started
    for name in requested_features():
        module_name, function_name = features.FEATURES[name].register.split(":")
        getattr(importlib.import_module(module_name), function_name)()
        logger.info("prefillonly: applied runtime patch %s", name)
    for variable, entry in INSTRUMENTS.items():
        if PATCHES_ENV in os.environ and os.environ.get(variable):
            module_name, function_name = entry.split(":")
            getattr(importlib.import_module(module_name), function_name)()


def _thread_lock_for_progress_bars() -> None:
    """SGLang's workers end with SIGKILL (Engine.shutdown, serve's exit), so anything that
    registered with multiprocessing's resource tracker stays registered, and the tracker
    warns at the main process's exit ("1 leaked semaphore objects"). The one such object
    is tqdm's default write lock, a multiprocessing RLock created by the weight loader's
    progress bar; a worker's bars need only a thread lock."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
