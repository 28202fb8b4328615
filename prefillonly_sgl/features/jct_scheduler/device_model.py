"""The job-time model of a GPU without a profile (plain Python): the model's own shape
(config.json) over the card's rates, instead of the CPU's built-in numbers.

On a card a forward's time is a fixed cost (the scheduler's step, the kernels' launches,
per layer) plus the matmuls of its tokens plus the attention of its token pairs; the CPU
model (jct_model.DEFAULTS: 63 ms a batch, 0.79 ms a token in bfloat16) made a cold
1-2k-token recommendation leader "long" on an H200 (1-3 s predicted, run alone with its
riders) while stock filled 8,192-token batches (issue 73). From the shape:

    per_token         = 2 * (linear weights of the decoder layers) / matmul rate
    per_token_squared = 2 * layers * heads * head_dim / attention rate   (causal: half)
    per_token_cached  = 4 * layers * heads * head_dim / attention rate
    per_batch         = step + layers * per_layer

The rates are what a card achieved here: the H200's bf16 matmul 792 TFLOP/s and its
FlashInfer prefill 210-380 TFLOP/s (benchmarks/gpu_results/prefill_h200_results.md); a
forward's GEMMs at a few thousand tokens reach about half the matmul peak. The fixed
costs are estimates until a card's forward log fits them (`prefillonly profile` on the
card, whose saved profile then wins). What counts for the policy is the ratio of a
request's work to per_batch (long_factor) and between requests (size_ratio); on a card
the per-batch cost dominates a small model's short requests, so they batch together as
stock's do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prefillonly_sgl.features.jct_scheduler.jct_model import JctModel


@dataclass(frozen=True)
class CardRates:
    """What one kind of card achieves (16-bit weights)."""

    name: str  # matched, case-insensitive, in torch.cuda.get_device_name()
    matmul_flops: float  # a forward's GEMMs, FLOP/s
    attention_flops: float  # FlashInfer's prefill attention, FLOP/s
    step_s: float = 3e-3  # the scheduler's step and the logits' tail, per forward
    per_layer_s: float = 1e-4  # a layer's launches and small kernels, per forward
    measured: str = ""


# Hopper: the H200's measured rates (its compute is the H100's; the H100 measured the same
# attention times to three digits, benchmarks/README.md); Ampere at its published ratio.
CARDS = (
    CardRates(
        "H200",
        matmul_flops=792e12 * 0.5,
        attention_flops=300e12,
        measured="H200 2026-11-26: bf16 matmul 792 TFLOP/s, FlashInfer prefill 210-380",
    ),
    CardRates(
        "H100",
        matmul_flops=792e12 * 0.5,
        attention_flops=300e12,
        measured="the H200's figures (the same compute; the H100 measured the same attention)",
    ),
    CardRates(
        "A100",
        matmul_flops=312e12 * 0.5,
        attention_flops=120e12,
        measured="published peak 312 TFLOP/s at the Hopper cards' measured share",
    ),
)
# A card not in the table: the Ampere figures (an under-estimate of a newer card's rates
# scales every prediction alike; the ratios the policy reads stay right).
OTHER_CARD = CardRates("CUDA", matmul_flops=156e12, attention_flops=120e12, measured="")


def card_rates(device_name: str) -> CardRates:
    name = device_name.upper()
    return next((card for card in CARDS if card.name in name), OTHER_CARD)


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def linear_weights(self) -> int:
        """Weights of the decoder layers' matmuls (q, k, v, o, gate, up, down)."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return self.layers * (attention + 3 * self.hidden * self.intermediate)


def decoder_shape(model_path: str | Path) -> DecoderShape | None:
    """A dense decoder's shape from config.json (its text_config for a multimodal one);
    None when the fields are missing (the caller keeps the built-in model)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config") or config
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        intermediate = int(config["intermediate_size"])
        if config.get("num_experts_per_tok"):  # an MoE layer computes its active experts
            expert = config.get("moe_intermediate_size") or intermediate
            intermediate = int(expert) * int(config["num_experts_per_tok"])
        return DecoderShape(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            intermediate=intermediate,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
        )
    except (KeyError, TypeError, ValueError):
        return None


def card_model(shape: DecoderShape, device_name: str) -> JctModel:
    """The job-time model of `shape` on the card named `device_name`."""
    card = card_rates(device_name)
    pair = shape.layers * shape.heads * shape.head_dim  # per (query, key) pair, per MAC
    return JctModel(
        per_batch=card.step_s + shape.layers * card.per_layer_s,
        per_token=2.0 * shape.linear_weights / card.matmul_flops,
        per_token_cached=4.0 * pair / card.attention_flops,
        per_token_squared=2.0 * pair / card.attention_flops,
        source=f"card estimate: {device_name} as {card.name}"
        + (f" ({card.measured})" if card.measured else ""),
    )
