"""Make ``import torchvision`` harmless next to a CPU-only torch.

PyPI's torchvision wheels are CUDA builds: their C++ extension fails to load against the
CPU torch, and ``torchvision/_meta_registrations.py`` then calls
``torch.library.register_fake("torchvision::nms")`` on an operator that was never defined,
so the import raises "operator torchvision::nms does not exist". SGLang imports torchvision
at module level (multimodal configs), so this would break the text-only engine too.
Defining the two schemas first lets the import succeed; the ops themselves stay
unavailable (calling them raises), which text models never do.

A torchvision built for the installed torch (the engine kit's dress rehearsal: the card's
CUDA torch and its torchvision, run on a CPU) loads its extension, which defines the
schemas itself; defining them first would make that load fail. So the extension is tried
first, and the schemas are defined only where it does not load.
"""

from __future__ import annotations

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keeps the torch.library.Library alive: dropping it undefines the ops


def define_missing_ops(package_dir: str | None = None) -> None:
    """package_dir: torchvision's folder (its extension, _C*.so, is tried there first)."""
    global _library
    import torch

    missing = [name for name in _SCHEMAS if not _op_exists(torch, name)]
    if not missing or _extension_loads(torch, package_dir):
        return
    _library = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        _library.define(_SCHEMAS[name])


def _op_exists(torch, name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _extension_loads(torch, package_dir: str | None) -> bool:
    """Whether torchvision's own extension loads against this torch (then it defines its
    ops, and torchvision's import loads it again: the same library, once)."""
    from pathlib import Path

    for library in sorted(Path(package_dir).glob("_C*.so")) if package_dir else ():
        try:
            torch.ops.load_library(str(library))
        except (OSError, RuntimeError):
            return False
        return True
    return False
