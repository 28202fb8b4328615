"""Runtime patches to SGLang as tables: {SGLang symbol: (hook type, function)}.

Each feature writes one table per process it changes (e.g. its tokenizer_process.py and
scheduler_process.py: features/prefill_kv/), so what is patched where reads as a list;
every target is also listed in sglang_runtime/hook_targets.py, which a test resolves
against the pinned SGLang.
The hook types are SGLang's HookRegistry ones:
    "AROUND": hook(original, *args, **kwargs) -> result
    "AFTER":  hook(result, *args, **kwargs) -> result
    "BEFORE": hook(*args, **kwargs) -> (args, kwargs) or None
"""

from __future__ import annotations

from collections.abc import Callable

HookTable = dict[str, tuple[str, Callable]]

# Tables already handed to SGLang in this process (by name): registering one twice would
# chain its hooks twice.
_registered: set[str] = set()


def register_hooks(name: str, table: HookTable) -> None:
    """Registers `table` with SGLang's HookRegistry, once per process. SGLang applies
    registered hooks right after loading the plugins (in every process it starts)."""
    if name in _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, (hook_type, hook) in table.items():
        HookRegistry.register(target, hook, HookType[hook_type])
    _registered.add(name)


def apply_hooks_now(name: str, table: HookTable) -> None:
    """Registers `table` and applies it in this process now: for hooks in a process where
    SGLang's plugin loader already ran (it runs once per process), e.g. the main process
    of an Engine started after a stock one. Already-applied targets are left alone."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    register_hooks(name, table)
    HookRegistry.apply_hooks()
