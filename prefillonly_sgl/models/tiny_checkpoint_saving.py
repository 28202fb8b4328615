"""Saving a tiny random-weight checkpoint (the tiny families', guards' and decision
checkpoints' builders): the sizes every family shares, weights widened to std 0.2 (so a
wrong mask, position or layer kind shows up as a large error), float32, the tokenizer
beside them."""

from __future__ import annotations

from pathlib import Path

from prefillonly_sgl.models.tiny import common_sizes


def common_fields(tokenizer) -> dict:
    """Sizes every family shares: tiny.py's (64 wide, 4 query heads of 16, 2 KV heads)."""
    return common_sizes(tokenizer)


def widen(model, seed: int) -> None:
    """Random init is tiny (std 0.02): widen matrices (and gpt-oss's sinks) to std 0.2."""
    import torch

    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith(".sinks"):
                # Sinks start at zero; non-zero ones make a backend that ignores them fail.
                p.normal_(0.0, 1.0)


def save_checkpoint(model, tokenizer, out_dir: str | Path, seed: int) -> Path:
    import torch

    out = Path(out_dir)
    model = model.to(torch.float32)
    widen(model, seed)
    model.config.dtype = "float32"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
