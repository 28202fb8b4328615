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
MAMBA_MODULE = "prefillonly_sgl.sglang_runtime.cpu_support.sgl_kernel_mamba"
SHIM_VERSION_MARK = "prefillonly-cpu-shim"  # in the stand-in's __version__


class _ShimLoader(importlib.abc.Loader):
    """Loads the stand-in as the package ``sgl_kernel`` (so ``sgl_kernel.mamba`` can be
    imported from it), then registers the ``torch.ops.sgl_kernel`` ops SGLang's CPU path
    binds for linear-attention models: before any SGLang module can look them up."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        module.__file__ = self.origin
        module.__path__ = []
        with open(self.origin, encoding="utf-8") as source:
            exec(compile(source.read(), self.origin, "exec"), module.__dict__)
        from prefillonly_sgl.sglang_runtime.cpu_support import sgl_kernel_ops

        sgl_kernel_ops.register()


class _PatchingLoader(importlib.abc.Loader):
    """Loads a module as it is, then applies the named patch to it."""

    def __init__(self, real: importlib.abc.Loader, patch: str) -> None:
        self.real, self.patch = real, patch

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        self.real.exec_module(module)
        from prefillonly_sgl.sglang_runtime.cpu_support import sglang_patches

        getattr(sglang_patches, self.patch)(module)


# SGLang modules patched right after they load, {module: function of sglang_patches.py}:
# where SGLang's CPU path assumes an AMX CPU's sgl-kernel, or a CUDA-only op
# (sglang_patches.py says why).
POST_IMPORT_PATCHES = {
    "sglang.kernels.ops.attention.fla.layernorm_gated": "gated_rmsnorm_on_cpu_kernel",
    "sglang.kernels.ops.attention.fla.fused_norm_gate": "gated_rmsnorm_on_cpu_kernel",
    "sglang.srt.models.qwen2_moe": "shared_expert_gate_in_torch",
    "sglang.srt.layers.joint_schema_head": "flash_attention_on_cpu",
    "sglang.srt.layers.attention.mamba.causal_conv1d": "short_conv_in_torch",
    "sglang.srt.layers.attention.mamba.mamba": "mamba2_in_torch",
}


def _is_standin(module) -> bool:
    return SHIM_VERSION_MARK in str(getattr(module, "__version__", ""))


class _CpuImportHook(importlib.abc.MetaPathFinder):
    """Serves ``sgl_kernel`` from our pure-torch shim (unless a real build is installed)
    and prepares torch's op registry before torchvision imports."""

    # Marker instead of isinstance: runpy and a normal import create two distinct classes.
    prefillonly_cpu_hook = True

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname in POST_IMPORT_PATCHES and not self._busy:
            return self._patched_spec(fullname)
        if self._busy or fullname not in ("sgl_kernel", "sgl_kernel.mamba", "torchvision"):
            return None
        if fullname == "sgl_kernel.mamba":  # only under our stand-in, never a real build
            if not _is_standin(sys.modules.get("sgl_kernel")):
                return None
            mamba = importlib.util.find_spec(MAMBA_MODULE)
            return importlib.util.spec_from_file_location(fullname, mamba.origin)
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
            return importlib.util.spec_from_loader(
                fullname, _ShimLoader(shim.origin), origin=shim.origin, is_package=True
            )
        finally:
            self._busy = False

    def _patched_spec(self, fullname: str):
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, POST_IMPORT_PATCHES[fullname])
        return spec


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
