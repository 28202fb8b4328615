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

logger = logging.getLogger(__name__)

PATCHES_ENV = "PREFILLONLY_PATCHES"

# feature name -> "module:function" that registers its SGLang hooks. Features land here as
# they are built (prefill-only attention, prefill-only KV, hybrid prefilling, scheduling).
FEATURES: dict[str, str] = {
    # Attention of new tokens only (no recomputation over the cached prefix).
    "prefill_attention": "prefillonly_sgl.sglang_runtime.prefill_attention:register",
    # Scoring requests keep pool KV only for their reusable prefix (needs prefill_attention).
    "prefill_kv": "prefillonly_sgl.sglang_runtime.prefill_kv:register",
}


def requested_features(environ=os.environ) -> list[str]:
    raw = environ.get(PATCHES_ENV, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in FEATURES]
    if unknown:
        raise ValueError(
            f"{PATCHES_ENV} names unknown features {unknown}; known: {sorted(FEATURES)}"
        )
    return names


@contextlib.contextmanager
def patches_enabled(features: list[str]):
    """Set PATCHES_ENV to `features` while SGLang starts (its spawned workers inherit the
    environment), then restore it, so a later stock engine in this process stays stock."""
    unknown = [name for name in features if name not in FEATURES]
    if unknown:
        raise ValueError(f"unknown runtime patches {unknown}; known: {sorted(FEATURES)}")
    saved = os.environ.get(PATCHES_ENV)
    os.environ[PATCHES_ENV] = ",".join(features)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PATCHES_ENV, None)
        else:
            os.environ[PATCHES_ENV] = saved


def load_plugin() -> None:
    import importlib

    for name in requested_features():
        module_name, function_name = FEATURES[name].split(":")
        getattr(importlib.import_module(module_name), function_name)()
        logger.info("prefillonly: applied runtime patch %s", name)
