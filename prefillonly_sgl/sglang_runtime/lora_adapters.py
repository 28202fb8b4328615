"""Loading and unloading LoRA adapters on a running TokenizerManager (the Engine's
load_lora_adapter / unload_lora_adapter; the server has SGLang's own routes)."""

from __future__ import annotations


async def load_adapter(tokenizer_manager, name: str, path: str, pinned: bool = False):
    """SGLang's load_lora_adapter under ``name``; its answer (success, error_message)."""
    from sglang.srt.managers.io_struct import LoadLoRAAdapterReqInput

    request = LoadLoRAAdapterReqInput(lora_name=name, lora_path=path, pinned=pinned)
    return await tokenizer_manager.load_lora_adapter(request, None)


async def unload_adapter(tokenizer_manager, name: str):
    """SGLang's unload_lora_adapter (after the requests using it finish); its answer."""
    from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

    return await tokenizer_manager.unload_lora_adapter(UnloadLoRAAdapterReqInput(lora_name=name))
