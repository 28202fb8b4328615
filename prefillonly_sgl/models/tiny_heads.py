"""Tiny classification-head checkpoints (random weights) of the families whose heads the
table lists (families.Family.heads): the family's tiny causal checkpoint
(tiny_family_checkpoints.py) with its LM head replaced by a `score` head, in the shape
Hugging Face publishes fine-tuned classifiers and reward models in
(`*ForSequenceClassification`, `num_labels`, `id2label`; a reward model is one label).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefillonly_sgl.models.tiny import build_tiny_model
from prefillonly_sgl.models.tiny_family_checkpoints import FAMILY_BUILDERS

SENTIMENT = ("negative", "neutral", "positive")
HEAD_CLASSES = {
    "llama": "LlamaForSequenceClassification",
    "qwen2": "Qwen2ForSequenceClassification",
    "qwen3": "Qwen3ForSequenceClassification",
}


def build_tiny_head(
    out_dir: str | Path,
    family: str = "llama",
    labels: tuple[str, ...] = SENTIMENT,
    seed: int = 0,
    **sizes,
) -> Path:
    """Write `family`'s tiny checkpoint under a classification head with these classes
    (one label: a reward model's score); returns the folder. sizes: the base's config
    fields instead of the tiny ones (Llama and Qwen2 only: tiny.build_tiny_model's)."""
    if family not in HEAD_CLASSES:
        raise ValueError(f"no tiny head for {family!r}: choose from {sorted(HEAD_CLASSES)}")
    with tempfile.TemporaryDirectory() as tmp:
        if sizes:
            if family not in ("llama", "qwen2"):
                raise ValueError(f"sizes for a {family} head: only llama and qwen2 take them")
            base = build_tiny_model(Path(tmp) / "base", family, seed, **sizes)
        else:
            base = FAMILY_BUILDERS[family](Path(tmp) / "base", seed)
        return add_head(base, out_dir, HEAD_CLASSES[family], labels, seed)


def add_head(
    base: str | Path, out_dir: str | Path, architecture: str, labels, seed: int = 0
) -> Path:
    """`base` (a causal LM folder) under a classification head of `architecture` with
    these classes, random, written to out_dir (the benchmarks' heads are the default
    model's this way)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(base)
    config.architectures = [architecture]
    config.num_labels = len(labels)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}
    # Prompts are scored one at a time: the head reads the last position (a pad id would
    # make transformers read the last non-pad one instead).
    config.pad_token_id = None
    model = AutoModelForSequenceClassification.from_pretrained(
        base, config=config, dtype=torch.float32
    )
    torch.manual_seed(seed + 2)
    with torch.no_grad():
        # classes visibly apart, not saturated (the tiny models are 64 wide)
        model.score.weight.normal_(0.0, 0.5 * (64 / model.config.hidden_size) ** 0.5)
    out = Path(out_dir)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out
