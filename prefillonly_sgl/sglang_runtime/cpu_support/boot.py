"""Run at interpreter start (via ``prefillonly_sgl_cpu.pth``) in a CPU-only environment.

Kept cheap on purpose: it imports neither torch nor sglang, it only sets an environment
default and installs an import hook that acts when ``sgl_kernel`` or ``torchvision`` is
first imported. The .pth file runs this file by path (runpy) rather than importing the
package, so ``prefillonly_sgl`` itself is imported later through the normal sys.path: a
second checkout sharing the environment (cwd first on sys.path) gets its own code.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

# Read by sglang.srt.utils.common.is_cpu(); without it model setup takes CUDA-only paths.
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"
SHIM_MODULE = "prefillonly_sgl.sglang_runtime.cpu_support.sgl_kernel_shim"


class _CpuImportHook(importlib.abc.MetaPathFinder):
    """Serves ``sgl_kernel`` from our pure-torch shim (unless a real build is installed)
    and prepares torch's op registry before torchvision imports."""

    # Marker instead of isinstance: runpy and a normal import create two distinct classes.
    prefillonly_cpu_hook = True

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if self._busy or fullname not in ("sgl_kernel", "torchvision"):
            return None
        self._busy = True  # our own find_spec calls below must reach the real finders
        try:
            real = importlib.util.find_spec(fullname)
            if fullname == "torchvision":
                from prefillonly_sgl.sglang_runtime.cpu_support.torchvision_compat import (
                    define_missing_ops,
                )

                locations = (real.submodule_search_locations or [None]) if real else [None]
                define_missing_ops(locations[0])
                return None  # let the normal finders import the real torchvision
            if real is not None:
                return None  # a real sgl_kernel (e.g. a CPU build someone compiled) wins
            shim = importlib.util.find_spec(SHIM_MODULE)
            return importlib.util.spec_from_file_location(fullname, shim.origin)
        finally:
            self._busy = False


def is_active() -> bool:
    return any(getattr(f, "prefillonly_cpu_hook", False) for f in sys.meta_path)


# SGLang warns about GPU-only features at import in every process; on a CPU install they
# are expected and say nothing actionable, so they are silenced (only these messages).
_EXPECTED_CPU_WARNINGS = (
    r"Only CUDA.* support",
    r"Triton is not supported on current platform",
)


def activate() -> None:
    """Idempotent: safe to call from the .pth file and again from library code."""
    os.environ.setdefault(CPU_ENGINE_ENV, "1")
    for message in _EXPECTED_CPU_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    if not is_active():
        sys.meta_path.insert(0, _CpuImportHook())


activate()
