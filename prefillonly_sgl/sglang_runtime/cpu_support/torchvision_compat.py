"""Make ``import torchvision`` harmless next to a CPU-only torch.

PyPI's torchvision wheels are CUDA builds: their C++ extension fails to load against the
CPU torch, and ``torchvision/_meta_registrations.py`` then calls
``torch.library.register_fake("torchvision::nms")`` on an operator that was never defined,
so the import raises "operator torchvision::nms does not exist". SGLang imports torchvision
at module level (multimodal configs), so this would break the text-only engine too.
Defining the two schemas first lets the import succeed; the ops themselves stay
unavailable (calling them raises), which text models never do.
"""

from __future__ import annotations

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # keeps the torch.library.Library alive: dropping it undefines the ops


def define_missing_ops() -> None:
    global _library
    import torch

    missing = [name for name in _SCHEMAS if not _op_exists(torch, name)]
    if not missing:
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
