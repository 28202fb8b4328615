"""`prefillonly verify --lora ADAPTER`: the adapter merged into the model for the
transformers reference (peft's merge_and_unload, saved to a folder), the name every
variant's engine loads it under, and the calls' context that runs every probe under it."""

from __future__ import annotations

import contextlib

LORA_NAME = "verified-adapter"  # the name verify loads an adapter under


@contextlib.contextmanager
def under_adapter(name: str | None):
    """Every engine call made inside runs under the adapter `name` (the calls' context,
    scoring/call_context.py: an Engine call starts from the one carried here)."""
    from prefillonly_sgl.scoring.call_context import carrying, current

    if name is None:
        yield
        return
    with carrying(current().entering(adapter=name)):
        yield


def merge_adapter(model: str, adapter: str, out: str, dtype: str) -> str:
    """`model` with the LoRA adapter `adapter` merged (peft), saved to `out`."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ValueError(
            "verify --lora needs peft (it merges the adapter): pip install peft"
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(out)
    AutoTokenizer.from_pretrained(model).save_pretrained(out)
    return out
