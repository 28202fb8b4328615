"""The inputs of benchmarks/images.py (issue 86): a random-weight Qwen2.5-VL in the
published layout at a benchmark's size, the product photos (seeded noise PNGs), the
instruction and the candidate categories both systems are given, and the agreement of
the systems' scores.

The checkpoint: prefillonly_sgl/models/tiny_vl_checkpoints.py's `build_qwen2_5_vl` (the
published layout: Qwen2_5_VLForConditionalGeneration, M-RoPE, windowed and full vision
blocks, patch 14 merged 2x2, the ChatML tokenizer with the vision markers, the published
chat template, the image and video processors) with its sizes as parameters (VL_SHAPES).
"tiny" is that very checkpoint (64 wide: all overhead); "small" a text model 512 wide and
6 layers behind a 4-block vision tower 256 wide, its weights at std 1/sqrt(fan-in) (the
tiny one's std 0.2 would blow a 512-wide residual up: every probability 0 or 1).
"""

from __future__ import annotations

import io
import math
import zlib
from pathlib import Path

# Qwen2.5-VL's image placeholder: SGLang's processor expands it to the image's tokens (an
# image with no placeholder in the text is dropped silently by stock SGLang).
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

# Published Qwen2.5-VL-7B: text 3584 wide, 28 layers, 28 heads of 128, 4 KV heads, mrope
# [16, 24, 24], untied; vision 32 blocks 1280 wide (16 heads), window 112 px, full
# attention in blocks [7, 15, 23, 31]. "small": the same layout, scaled down.
VL_SHAPES = {
    "tiny": None,  # tiny_vl_checkpoints' qwen2_5_vl
    "small": dict(
        text=dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=2,
            mrope_section=[8, 12, 12],  # head_dim 64: halves of its rotary dims
        ),
        vision=dict(
            depth=4,
            hidden_size=256,
            intermediate_size=768,
            num_heads=4,
            window_size=112,
            fullatt_block_indexes=[3],
        ),
    ),
}

# Each call's items: "Category: X. Correct? Answer:" for 20 of these; the first call about
# an image asks about the first 20, the repeat about the next 20 (new items).
CATEGORIES = [
    "shoes",
    "bags",
    "hats",
    "watches",
    "sunglasses",
    "jackets",
    "dresses",
    "jeans",
    "shirts",
    "socks",
    "scarves",
    "gloves",
    "belts",
    "rings",
    "necklaces",
    "backpacks",
    "wallets",
    "umbrellas",
    "boots",
    "sandals",
    "lamps",
    "chairs",
    "tables",
    "sofas",
    "mugs",
    "plates",
    "kettles",
    "toasters",
    "blenders",
    "pillows",
    "blankets",
    "towels",
    "candles",
    "clocks",
    "mirrors",
    "rugs",
    "vases",
    "shelves",
    "desks",
    "beds",
]


def build_vl(shape: str, folder: Path, seed: int = 0) -> Path:
    """A random-weight Qwen2.5-VL of `shape` (VL_SHAPES), float32, built once into
    `folder` (a folder already holding a config is reused)."""
    if (folder / "config.json").exists():
        return folder
    if VL_SHAPES[shape] is None:
        from prefillonly_sgl.models.tiny_family_checkpoints import build_family

        return build_family("qwen2_5_vl", folder, seed)
    return _build_sized(VL_SHAPES[shape], folder, seed)


def _build_sized(sizes: dict, folder: Path, seed: int) -> Path:
    """tiny_vl_checkpoints' qwen2_5_vl with `sizes` in place of its tiny ones, and
    weights of std 1/sqrt(fan-in) (the tiny checkpoints' 0.2 would push every probability
    to 0 or 1 at this width)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from prefillonly_sgl.models.tiny_vl_checkpoints import (
        qwen2_5_vl_parts,
        save_qwen2_5_vl_processor,
    )

    text = dict(sizes["text"])
    mrope = text.pop("mrope_section")
    tok, config = qwen2_5_vl_parts(text, sizes["vision"], mrope)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:  # matrices, embeddings, the patch convolution
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
    model.config.dtype = "float32"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    save_qwen2_5_vl_processor(tok, folder)
    return folder


def photo(tag: str, size: int) -> bytes:
    """A size x size PNG of noise seeded by `tag` (every pixel matters to the vision
    tower; every tag a new image, uncached)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(zlib.crc32(tag.encode()))
    pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG")
    return out.getvalue()


def instruction(tag: str, image: bool = True) -> str:
    """The call's query: the photo (its placeholder, unless `image` is False) and a short
    instruction naming the product (`tag`: every tag a new, uncached query)."""
    return (
        "<|im_start|>user\n"
        + (PLACEHOLDER if image else "")
        + f"Product photo {tag}. Is this the product's category? "
    )


def items(n: int, repeat: bool = False) -> list[str]:
    """n candidate categories (the next n for a repeat: new items about the same image)."""
    names = CATEGORIES[n : 2 * n] if repeat else CATEGORIES[:n]
    if len(names) < n:
        raise ValueError(f"at most {len(CATEGORIES) // 2} items (CATEGORIES)")
    return [f"Category: {name}. Correct? Answer:" for name in names]


def label_ids(tokenizer) -> list[int]:
    """ " Yes" and " No" (one token each in the tiny tokenizer)."""
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in (" Yes", " No")]
    if any(len(i) != 1 for i in ids):
        raise ValueError(f'" Yes" / " No" are not one token each: {ids}')
    return [i[0] for i in ids]


def score_diff(ours_rows: list[dict], stock_rows: list[dict]) -> dict:
    """The largest |ours - stock| over every probability of every round (same image, same
    prompts)."""
    diffs = [
        abs(a - b)
        for o, s in zip(ours_rows, stock_rows, strict=True)
        for row_o, row_s in zip(o["scores"], s["scores"], strict=True)
        for a, b in zip(row_o, row_s, strict=True)
    ]
    return {"compared": len(diffs), "max_abs_diff": max(diffs) if diffs else None}


def rerank_agreement(ours_scores: list[list[float]], rerank: list[float | None]) -> dict:
    """The rerank path's P(Yes) / (P(Yes) + P(No)) from its first token's top logprobs
    (where both are there) against ours' P(Yes) over the two labels, same image and prompts."""
    diffs = [abs(r - o[0]) for o, r in zip(ours_scores, rerank, strict=True) if r is not None]
    return {
        "compared": len(diffs),
        "of": len(rerank),
        "max_abs_diff": max(diffs) if diffs else None,
    }


def expanded_tokens(model: str | Path, image: bytes) -> int:
    """How many tokens the model's processor expands the image's placeholder to."""
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(model)
    grid = processor(images=[Image.open(io.BytesIO(image)).convert("RGB")])["image_grid_thw"]
    return int(grid.prod()) // processor.merge_size**2
