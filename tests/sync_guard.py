"""A CPU stand-in for CUDA's sync debug mode: code under test runs with its "device"
tensors on torch's `meta` device (shapes, no data), and every operation that would make
a CUDA host wait for the device raises, naming it.

On a card the host must never wait for the device between SGLang's barrier and a
forward's launch, nor inside a layer (issue 73: a boolean-mask assignment per batch cost
ours the CPU/GPU overlap stock keeps). What waits: reading a device value on the host
(`.item()`, `.tolist()`, `bool(t)`, a copy to the CPU), every operation whose output
size depends on device data (`nonzero`, `masked_select`, boolean-mask indexing and
assignment), and a blocking copy from the host (torch synchronises the stream after a
copy without non_blocking=True, and so after indexing a device tensor with a host index,
which it copies so). A meta tensor refuses the first kind by itself; boolean-mask
assignment it does not (its meta kernel needs no count), so this mode refuses every kind
by name. Host (CPU) tensors are free: they are what the code should build its indices
from, and copy over with non_blocking=True.

    with DeviceSyncGuard():
        hook(...)          # raises HostDeviceSync on the first sync
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten

# Operations whose result's size (or value on the host) needs device data.
_DATA_DEPENDENT = {
    aten.nonzero.default,
    aten.nonzero_static.default,
    aten.masked_select.default,
    aten._local_scalar_dense.default,
    aten.is_nonzero.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.repeat_interleave.Tensor,
}
# Indexing operations: they sync when an index is a boolean mask.
_INDEXING = {
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}


class HostDeviceSync(AssertionError):
    """An operation that would make the host wait for the device."""


def _on_device(tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors)


class DeviceSyncGuard(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []  # every operation on a device tensor, in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        target = kwargs.get("device")
        if _on_device(tensors) or (isinstance(target, torch.device) and target.type == "meta"):
            self.ops.append(str(func))
            if func in _DATA_DEPENDENT:
                raise HostDeviceSync(f"{func} needs the device's data on the host")
            if func in _INDEXING:
                indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(
                    isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                    for i in indices or ()
                ):
                    raise HostDeviceSync(f"{func} with a boolean mask (its count is the device's)")
            if func in _INDEXING and any(
                isinstance(i, torch.Tensor) and i.device.type == "cpu" and i.dim() > 0
                for i in (args[1] if len(args) > 1 else ()) or ()
            ):
                raise HostDeviceSync(f"{func} with a host index (copied over blocking)")
            if func is aten._to_copy.default:
                source, target = args[0].device.type, kwargs.get("device")
                if target == torch.device("cpu") and source == "meta":
                    raise HostDeviceSync(f"{func}: a device tensor copied to the host")
                if source == "cpu" and target is not None and target.type == "meta":
                    if not kwargs.get("non_blocking", False):
                        raise HostDeviceSync(f"{func}: a blocking copy from the host")
            if func is aten.copy_.default:
                target, source = args[0].device.type, args[1].device.type
                if target == "cpu" and source == "meta":
                    raise HostDeviceSync(f"{func}: a device tensor copied to the host")
                blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
                if target == "meta" and source == "cpu" and args[1].dim() > 0 and blocking:
                    raise HostDeviceSync(f"{func}: a blocking copy from the host")
        return func(*args, **kwargs)
