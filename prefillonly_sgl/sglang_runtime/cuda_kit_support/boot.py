"""Run at interpreter start on the engine kit's card (CUDA, no sgl-kernel): see
__init__.py. Cheap on purpose: it imports neither torch nor sglang nor flashinfer, it sets
SGLang's switches (defaults only: a value already set wins) and installs an import hook.
Run by path (runpy) from the kit's sitecustomize.py, like cpu_support/boot.py."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

# SGLang's own switches (sglang/srt/environ.py, sglang/srt/entrypoints/engine.py).
SGLANG_DEFAULTS = {
    "SGLANG_FORCE_FUSED_OP_BACKEND": "torch",
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    # SGLang's Rust radix tree is built against its torch (2.14); on the card's torch 2.11
    # it panicked reading a tensor's dtype ("UnknownKind(17)", the dress rehearsal). Its
    # Python tree is the same structure.
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
}
STANDIN_MODULE = "prefillonly_sgl.sglang_runtime.cpu_support.sgl_kernel_shim"
FA3_SOURCE = "data/csrc/batch_prefill_sm90.cu"  # in flashinfer's package folder


class _StandinLoader(importlib.abc.Loader):
    """Loads `sgl_kernel` (and each `sgl_kernel.<sub>`) as the stand-in's code."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        module.__file__ = self.origin
        module.__path__ = []  # a package: `from sgl_kernel.kvcacheio import x` resolves
        with open(self.origin, encoding="utf-8") as source:
            code = compile(source.read(), self.origin, "exec")
        exec(code, module.__dict__)


class _PatchingLoader(importlib.abc.Loader):
    """Loads a module as it is, then applies `patch(module)` to it."""

    def __init__(self, real: importlib.abc.Loader, patch) -> None:
        self.real, self.patch = real, patch

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module) -> None:
        self.real.exec_module(module)
        self.patch(module)


def _fa2_unless_fa3_installed(module) -> None:
    """flashinfer.utils: "auto" answers "fa2" where FA3's sources are not installed (its
    JIT build would fail where "auto" picks it, on Hopper)."""
    package = os.path.dirname(module.__file__)
    if os.path.exists(os.path.join(package, FA3_SOURCE)):
        return  # FA3 can be built: FlashInfer chooses as it always does
    chosen = module.determine_attention_backend

    def fa2_only(*args, **kwargs) -> str:
        backend = chosen(*args, **kwargs)
        return "fa2" if backend == "fa3" else backend

    fa2_only.__doc__ = chosen.__doc__
    module.determine_attention_backend = fa2_only


def _no_dual_gemm_without_cutlass(module) -> None:
    """sglang.srt.layers.dual_gemm: the fused gate/up GEMM of small decode batches is a
    CuTe DSL kernel (Blackwell) whose module imports nvidia-cutlass-dsl while every
    Qwen2/Qwen3 MLP is built on CUDA; without that package (the card's image) the MLP
    keeps its two plain GEMMs, as on a GPU the kernel does not serve."""
    if importlib.util.find_spec("cutlass") is not None:
        return

    def _no_dual_gemm(self, gate_up_proj, hidden_size):
        return None

    module.DualGemm._select_mode = _no_dual_gemm


# Modules patched after they load: {module: patch}.
POST_IMPORT_PATCHES = {
    "flashinfer.utils": _fa2_unless_fa3_installed,
    "sglang.srt.layers.dual_gemm": _no_dual_gemm_without_cutlass,
}


def _real_spec(fullname: str, path=None, target=None):
    """The spec the other finders give, the stand-in hooks (this one, cpu_support's)
    left out: what is really installed."""
    for finder in sys.meta_path:
        if getattr(finder, "prefillonly_cuda_kit_hook", False) or getattr(
            finder, "prefillonly_cpu_hook", False
        ):
            continue
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find else None
        if spec is not None:
            return spec
    return None


class _CudaKitImportHook(importlib.abc.MetaPathFinder):
    # Marker instead of isinstance: runpy and a normal import create two distinct classes.
    prefillonly_cuda_kit_hook = True

    def __init__(self) -> None:
        self._real_sgl_kernel: bool | None = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] == "sgl_kernel":
            return self._sgl_kernel_spec(fullname)
        if fullname in POST_IMPORT_PATCHES:
            spec = _real_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, POST_IMPORT_PATCHES[fullname])
            return spec
        return None

    def _sgl_kernel_spec(self, fullname: str):
        if self._real_sgl_kernel is None:
            self._real_sgl_kernel = _real_spec("sgl_kernel") is not None
        if self._real_sgl_kernel:
            return None  # a real sgl-kernel wins
        origin = _standin_origin()
        return importlib.machinery.ModuleSpec(
            fullname, _StandinLoader(origin), origin=origin, is_package=True
        )


def _standin_origin() -> str:
    """The stand-in's file (found, not imported: it is executed as sgl_kernel)."""
    return importlib.util.find_spec(STANDIN_MODULE).origin


def is_active() -> bool:
    return any(getattr(f, "prefillonly_cuda_kit_hook", False) for f in sys.meta_path)


def activate() -> None:
    """Idempotent: safe to call from sitecustomize.py and again from library code."""
    for name, value in SGLANG_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if not is_active():
        sys.meta_path.insert(0, _CudaKitImportHook())


activate()
