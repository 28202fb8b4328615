"""SGLang's LoRA on a machine without an accelerator: its host staging tensors unpinned.

SGLang 0.5.23's LoRA layers and its torch LoRA backend pin the small host tensors they
stage for copies to the device (``torch.tensor(..., pin_memory=True)``,
``.pin_memory()``) unconditionally (sglang #31894); without an accelerator torch refuses
("pin_memory=True requires a CUDA or other accelerator backend") and a server started with
--enable-lora exits. Pinned memory only speeds copies to an accelerator, so without one the
tensors can stay ordinary host memory.

The fix is one AROUND hook (``HOOKS``, listed in hook_targets.py) on each SGLang function
that pins: while it runs, a torch function mode (``HostTensorsUnpinned``) drops
``pin_memory=`` from the calls it makes and answers ``Tensor.pin_memory()`` with the
tensor itself. Torch's mode stack is per thread, so only those calls, on the thread making
them, see it: nothing of torch or of an SGLang module is replaced. SGLang's LoRA memory
pool needs nothing: it asks ``is_pin_memory_available()``, which SGLang's CPU platform
answers no. Registered by the plugin (plugin.load_plugin) in every prefillonly process of a
CPU install (cpu_support active) without CUDA.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from prefillonly_sgl.hooking.hooks import HookTable, register_hooks

TABLE_NAME = "cpu_lora_host_tensors"

# Every SGLang function that pins a host tensor on the torch LoRA backend's path (the
# backend a CPU gets, machine/device_defaults.py); the others (Triton, chunked, Ascend)
# never run without an accelerator. Subclasses reach these through super() (Merged and
# QKV column layers call ColumnParallelLinearWithLoRA.__init__), so the class that pins is
# the one hooked.
PINNING_FUNCTIONS = (
    "sglang.srt.lora.layers.VocabParallelEmbeddingWithLoRA.__init__",
    "sglang.srt.lora.layers.ParallelLMHeadWithLoRA.__init__",
    "sglang.srt.lora.layers.ColumnParallelLinearWithLoRA.__init__",
    "sglang.srt.lora.layers.MergedColumnParallelLinearWithLoRA.set_lora_info",
    "sglang.srt.lora.layers.QKVParallelLinearWithLoRA.__init__",
    "sglang.srt.lora.layers.RowParallelLinearWithLoRA.set_lora_info",
    "sglang.srt.lora.backend.torch_backend.TorchNativeLoRABackend.prepare_lora_batch",
)


class HostTensorsUnpinned(TorchFunctionMode):
    """While entered (on this thread): ``pin_memory=`` dropped from every torch call, and
    ``Tensor.pin_memory()`` the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            return args[0]
        if "pin_memory" in kwargs:
            kwargs = {name: value for name, value in kwargs.items() if name != "pin_memory"}
        return func(*args, **kwargs)


def with_host_tensors_unpinned(original, *args, **kwargs):
    """AROUND: SGLang's function, its host tensors left unpinned."""
    with HostTensorsUnpinned():
        return original(*args, **kwargs)


HOOKS: HookTable = {target: ("AROUND", with_host_tensors_unpinned) for target in PINNING_FUNCTIONS}


def needed() -> bool:
    """A CPU install (cpu_support active) on a machine without CUDA."""
    from prefillonly_sgl.sglang_runtime.cpu_support import boot

    return boot.is_active() and not torch.cuda.is_available()


def register() -> None:
    """The hooks, in this process, where they are needed (plugin.load_plugin)."""
    if needed():
        register_hooks(TABLE_NAME, HOOKS)
