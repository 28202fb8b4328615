"""Random LoRA adapters for tests and benchmarks (peft, a dev dependency): r=8 on every
projection of a Llama-shaped model, with random A and B (peft's init_lora_weights=False,
so the adapter changes the answers; peft's default B = 0 would not)."""

from __future__ import annotations

from pathlib import Path

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def build_lora_adapter(base: str | Path, out_dir: str | Path, seed: int = 0, rank: int = 8):
    """Write an adapter of `base` to out_dir (peft's folder: adapter_config.json,
    adapter_model.safetensors); returns (the folder, the peft model: base + adapter)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(LORA_TARGETS),
        init_lora_weights=False,
    )
    adapted = get_peft_model(model, config)
    adapted.save_pretrained(out_dir)
    return Path(out_dir), adapted
