"""The model-family registry (plain Python: no SGLang, no torch): which architectures each
family covers, the kinds of layer it is made of, and so which runtime features it cannot
run, and why.

A feature's limits belong to a kind of layer, never to an architecture: a family is a
list of kinds (LAYER_KINDS), and what it cannot run is the union of what its kinds cannot
(`Family.features_off`). Keys are feature names (features/__init__.py) or
"feature:variant" for one variant of a feature ("hybrid_prefill:layer", its whole-layer
mode: the family gets the other mode instead).

runtime_config.resolve reads the family of the model folder (`family_of_model`) and
switches those features off, with the reason, before anything starts (a feature the
user asked for explicitly is an error naming the family and docs/models.md); an
architecture outside the table starts with the features only once `prefillonly verify`
(verification/verify.py: against transformers, feature by feature) passed its
configuration or the user allowed it by name (verified_architectures.py), and then with a
warning naming verify where it was allowed unverified.
docs/models.md is the table as verify measured it on tiny checkpoints of each family
(models/tiny_family_checkpoints.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from prefillonly_sgl.models import config_fields

DOCS = "docs/models.md"
VERIFY_COMMAND = "prefillonly verify"
LAYER_MODE = "hybrid_prefill:layer"  # hybrid prefilling's whole-layer mode (the default)
CPU_STATE_POOL = 256  # recurrent states a linear-attention model keeps on CPU (see below)
# A recurrent state kept where a request's cached prefix ends (the linear_attention kind)
_STATE_AT_PREFIX = {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True}


@dataclass(frozen=True)
class LayerKind:
    """A kind of layer and what the runtime features do with it."""

    name: str
    summary: str
    # feature (or "feature:variant") -> why a model with this kind of layer cannot run it
    off: Mapping[str, str] = field(default_factory=dict)
    # what works but less well than on plain layers (docs/models.md lists it)
    notes: tuple[str, ...] = ()
    # SGLang ServerArgs fields a model with this kind of layer needs, per device, unless
    # the user gave them (RuntimeConfig.sglang_defaults)
    sglang_defaults: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    # A cold prompt's first forward ends at its reusable prefix (prefill-only KV keeps a
    # recurrent state there), so its later tokens are computed after a state handed over.
    splits_at_prefix: bool = False


def _recurrent_kind(name: str, summary: str) -> LayerKind:
    """A layer that carries a state along the sequence (Gated DeltaNet, a short
    convolution, a Mamba2 mixer): what the runtime features do with any of them."""
    return LayerKind(
        name,
        summary,
        off={
            # Such a layer carries a state (and a convolution) along the sequence, so rows
            # [s, e) cannot run without the rows before them in the same call
            # (layer_chunks.plan_layer refuses any such layer).
            LAYER_MODE: "whole-layer chunks need every layer token-wise outside its "
            "attention, and a recurrent layer carries a state and a convolution along the "
            "sequence: hybrid prefilling runs in token mode (MLPs, norms and rotary "
            "chunked, attention and the recurrent layers whole)",
            # features/prompt_logprobs matches an echo request past SGLang's cap and
            # extends it from a position inside a cached prompt, where a recurrent layer
            # has no state (verify measured 1.4 on the tiny Qwen3.5).
            "prompt_logprobs": "its cache continues an echo request from a position "
            "inside a cached prompt, where a recurrent layer keeps no state: echo "
            "logprobs are computed in one pass, as stock SGLang computes them",
        },
        notes=(
            "a reusable prefix is one state snapshot at its end (with the attention "
            "layers' KV): a cold prompt's first extend ends at the prefix, and items "
            "behind a cached prefix compute only their own tokens",
            "no state is kept for the suffix: the prompt's final state is dropped",
        ),
        # SGLang snapshots states at fixed intervals (its extra_buffer strategy) on GPUs
        # only; no_buffer keeps the state at the end of what a request cached, which is
        # where prefill-only KV ends a reusable prefix. no_buffer runs without the
        # overlapped scheduler (SGLang's own rule, mamba_hook.py). On CPU SGLang sizes its
        # state pool from the machine's memory: 90,838 slots (3.4 GB, 15 s of start-up
        # zero-filling it) for the tiny Qwen3.5 beside a 4,096-token KV pool; 256 states
        # (running requests and cached prefixes together) is the CPU's bound, as the KV
        # pool's 16,384 tokens is.
        sglang_defaults={
            "cpu": {**_STATE_AT_PREFIX, "max_mamba_cache_size": CPU_STATE_POOL},
            "cuda": _STATE_AT_PREFIX,
        },
        splits_at_prefix=True,
    )


LAYER_KINDS: dict[str, LayerKind] = {
    kind.name: kind
    for kind in (
        # Both kinds of decoder layer run hybrid prefilling's whole-layer chunks (issue 62):
        # the layer's own forward per slice of rows, its one attention redirected to a query
        # chunk (features/hybrid_prefill/layer_chunks.py decides per layer class at load).
        LayerKind(
            "llama_layer",
            "Llama / Qwen2-shaped decoder layer: input norm, attention (qkv, rotary, "
            "o_proj), post-attention norm with the residual add, gated MLP, nothing else",
        ),
        LayerKind(
            "other_layer",
            "a decoder layer of another shape (q / k norms, sandwich norms, residual "
            "multipliers, partial rotary, ...)",
        ),
        LayerKind("full_attention", "causal attention over the whole prompt"),
        LayerKind(
            "sliding_window",
            "attention over the last sliding_window tokens only",
            # The prefill-only attention runs sliding-window layers itself, the window
            # applied to the cached prefix and the new tokens in hand alike
            # (features/prefill_attention/windowed.py), so prefill-only KV holds: measured
            # on the tiny Gemma 3 (5 sliding : 1 full, window 16) within 2.7e-7.
            notes=(
                "sliding-window layers keep every cached token (one KV pool for all "
                "layers; prefill-only KV refuses SGLang's sliding-window pool)",
            ),
        ),
        # gpt-oss (issue 53): sinks on sliding-window and full layers alike. SGLang's stock
        # torch_native has neither, so the prefill-only CPU backend runs every such layer
        # itself, windows included (features/prefill_attention/windowed.py), and never
        # leaves one to the stock path (it raises there): prefill-only KV holds, unlike
        # the sliding_window kind's stock-path limits. Measured on the tiny checkpoint,
        # every feature on (tests/test_family_gpt_oss.py; `prefillonly verify --quick`:
        # cold 5e-10, cached 1.5e-9, echo logprobs 8.2e-6, greedy decode equal).
        LayerKind(
            "attention_sinks",
            "per-head sink logits in the attention's softmax (gpt-oss: on sliding-window "
            "and full layers), applied with the window by the prefill-only attention itself",
            notes=(
                "CPU only: on CUDA, SGLang's FlashInfer backend (ours is its subclass) has "
                "no sinks and SGLang refuses it for gpt-oss; FlashInfer query chunks take "
                "sinks and the window but the whole-layer forward is FlashInfer's",
                "sliding-window layers keep every cached token (SGLang's hybrid "
                "sliding-window pool is switched off: one pool for all layers)",
                "prefill-only attention is required: without it (stock SGLang too) SGLang "
                "refuses torch_native, which has no sinks, at start",
            ),
        ),
        # Every recurrent layer is the same shape to the engine: a per-sequence state
        # (and a convolution window) in SGLang's state pool, carried across extends. One
        # set of rules for all of them (_recurrent_kind); a kind adds only its summary.
        _recurrent_kind(
            "linear_attention",
            "linear attention (Gated DeltaNet) with a recurrent state and a short "
            "convolution per sequence, in SGLang's state pool",
        ),
        _recurrent_kind(
            "short_conv",
            "a gated short convolution (LFM2's conv layers) whose state is its last "
            "kernel - 1 inputs per sequence, in SGLang's state pool",
        ),
        _recurrent_kind(
            "mamba2",
            "a Mamba2 mixer (selective state space, SSD) with a recurrent state and a "
            "short convolution per sequence, in SGLang's state pool",
        ),
        # Vision-language models (issue 86): a vision tower writes each image's embeddings
        # over its placeholder tokens, positions are M-RoPE's (3 sections: time, height,
        # width). Prefill-only KV keeps an image of the query in the reusable prefix
        # (R counted in expanded positions: prefill_kv/policy.image_expanded_prefix_len);
        # SGLang keys an image in the radix cache by its hash.
        LayerKind(
            "image_tokens",
            "image embeddings from a vision tower over placeholder tokens, M-RoPE positions",
            off={
                # layer_chunks / query chunks take 1-D positions; M-RoPE's are 3 x tokens
                "hybrid_prefill": "its chunks carry one position per token; M-RoPE's are "
                "three (time, height, width) and are not chunked (not verified)",
            },
            notes=(
                "an item's own image is computed with the item; the query's image once, "
                "in the reusable prefix, the items packed behind it (docs/images.md)",
            ),
        ),
        LayerKind(
            "moe",
            "mixture-of-experts MLP",
            notes=(
                "hybrid prefilling's token mode does not chunk the expert MLPs (norms and "
                "rotary only); its layer mode runs them per chunk with the rest of the layer",
            ),
        ),
    )
}


@dataclass(frozen=True)
class Family:
    """One row of the table."""

    name: str  # the tiny checkpoint's name too (models/tiny_family_checkpoints.py)
    title: str  # as docs and errors write it
    architectures: tuple[str, ...]  # config.json `architectures` it covers
    layers: tuple[str, ...]  # LAYER_KINDS names
    # Family-specific limits that belong to no kind (rare: prefer a kind).
    own_off: Mapping[str, str] = field(default_factory=dict)
    # The same decoder under a classification head (fine-tuned classifiers, reward
    # models): SGLang's classes for it, which it serves as scoring models (docs/heads.md).
    heads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [k for k in self.layers if k not in LAYER_KINDS]
        if unknown:
            raise ValueError(f"family {self.name}: unknown layer kinds {unknown}")

    def features_off(self) -> dict[str, str]:
        """feature (or "feature:variant") -> the reason this family cannot run it."""
        off: dict[str, str] = {}
        for kind in self.layers:
            for key, reason in LAYER_KINDS[kind].off.items():
                off.setdefault(key, reason)
        for key, reason in self.own_off.items():
            off.setdefault(key, reason)
        return off

    def notes(self) -> tuple[str, ...]:
        return tuple(note for kind in self.layers for note in LAYER_KINDS[kind].notes)

    def splits_at_prefix(self) -> bool:
        """Whether prefill-only KV ends a cold prompt's first forward at its reusable
        prefix for this family (a recurrent state kept there)."""
        return any(LAYER_KINDS[kind].splits_at_prefix for kind in self.layers)

    @property
    def reads_images(self) -> bool:
        """Whether its models read images (a vision tower over image tokens)."""
        return "image_tokens" in self.layers

    def sglang_defaults(self, device: str) -> dict[str, object]:
        """The SGLang fields its kinds of layer need on `device` (the user's values win)."""
        fields: dict[str, object] = {}
        for kind in self.layers:
            fields.update(LAYER_KINDS[kind].sglang_defaults.get(device, {}))
        return fields


_LLAMA = ("llama_layer", "full_attention")
_OTHER = ("other_layer", "full_attention")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llama",
            "Llama",
            ("LlamaForCausalLM",),
            _LLAMA,
            heads=("LlamaForSequenceClassification",),
        ),
        Family(
            "qwen2",
            "Qwen2",
            ("Qwen2ForCausalLM",),
            _LLAMA,
            heads=("Qwen2ForSequenceClassification",),
        ),
        # SGLang runs Mistral and Phi-3 with Llama's decoder layers (fused qkv / gate_up).
        Family("mistral", "Mistral", ("MistralForCausalLM",), _LLAMA),
        Family("phi3", "Phi-3", ("Phi3ForCausalLM",), _LLAMA),
        Family(
            "qwen3",
            "Qwen3",
            ("Qwen3ForCausalLM",),
            _OTHER,  # q / k norms
            heads=("Qwen3ForSequenceClassification",),
        ),
        Family("qwen3_moe", "Qwen3-MoE", ("Qwen3MoeForCausalLM",), (*_OTHER, "moe")),
        Family("granite", "Granite", ("GraniteForCausalLM",), _OTHER),  # multipliers
        Family("olmo2", "OLMo 2", ("Olmo2ForCausalLM",), _OTHER),  # post norms
        # OLMo 3: OLMo 2's layer, 3 sliding : 1 full; its rotary parameters per layer type
        # read by sglang_runtime/model_configs.py (SGLang's own reading is wrong).
        Family(
            "olmo3",
            "OLMo 3",
            ("Olmo3ForCausalLM",),
            ("other_layer", "sliding_window", "full_attention"),
        ),
        # EXAONE 4: q / k norms, post norms, 3 sliding : 1 full with rotary on the sliding
        # layers only; on a CPU run by our backend under the name SGLang's check wants
        # (features/prefill_attention/window_models.py), its config read as transformers
        # writes it (sglang_runtime/model_configs.py).
        Family(
            "exaone4",
            "EXAONE 4",
            ("Exaone4ForCausalLM",),
            ("other_layer", "sliding_window", "full_attention"),
        ),
        # LFM2: gated short convolutions among attention layers (q / k norms); the
        # convolution's CPU kernel is Qwen3.5's (cpu_support/sglang_patches.py).
        Family(
            "lfm2",
            "LFM2",
            ("Lfm2ForCausalLM",),
            ("other_layer", "short_conv", "full_attention"),
        ),
        # Granite 4.0 hybrid: Mamba2 mixers among attention layers (no positional
        # embedding), Granite's multipliers, a shared MLP with or without routed experts.
        Family(
            "granite_hybrid",
            "Granite 4.0 hybrid",
            ("GraniteMoeHybridForCausalLM",),
            ("other_layer", "mamba2", "full_attention", "moe"),
        ),
        Family("glm4", "GLM-4", ("Glm4ForCausalLM",), _OTHER),  # sandwich norms
        Family(
            "gemma3",
            "Gemma 3",
            ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
            ("other_layer", "sliding_window", "full_attention"),
        ),
        # Qwen2.5-VL (issue 86): Qwen2's decoder under a vision tower (windowed attention,
        # 2x2 patch merging); its language model is plain attention.
        Family(
            "qwen2_5_vl",
            "Qwen2.5-VL",
            ("Qwen2_5_VLForConditionalGeneration",),
            (*_LLAMA, "image_tokens"),
        ),
        # Qwen3-VL (dense): Qwen3's decoder (q / k norms) under a vision tower whose
        # deepstack mergers add image features to the first decoder layers' outputs;
        # interleaved M-RoPE.
        Family(
            "qwen3_vl",
            "Qwen3-VL",
            ("Qwen3VLForConditionalGeneration",),
            (*_OTHER, "image_tokens"),
        ),
        # The attention-sinks helper owns this row (issue 53). Its sliding-window layers
        # are attention_sinks layers: the prefill-only backend runs them, window and sinks,
        # never the stock path the sliding_window kind describes (its limits do not apply).
        Family(
            "gpt_oss",
            "gpt-oss",
            ("GptOssForCausalLM",),
            ("other_layer", "full_attention", "attention_sinks", "moe"),
        ),
        # The linear-attention helper owns these two rows (issue 53).
        Family(
            "qwen3_5",
            "Qwen3.5",
            # Qwen3_5Model: a decision_config checkpoint's bare backbone; Qwen3_5TextModel: a
            # Kev checkpoint's (SGLang serves both as the classes before them).
            (
                "Qwen3_5ForCausalLM",
                "Qwen3_5ForConditionalGeneration",
                "Qwen3_5Model",
                "Qwen3_5TextModel",
            ),
            ("other_layer", "linear_attention", "full_attention"),
        ),
        # Qwen3-Next: the same Gated DeltaNet layers (3 linear : 1 full) with a gated
        # full attention and a shared-expert MoE; Qwen3.5's predecessor.
        Family(
            "qwen3_next",
            "Qwen3-Next",
            ("Qwen3NextForCausalLM",),
            ("other_layer", "linear_attention", "full_attention", "moe"),
        ),
        Family(
            "qwen3_5_moe",
            "Qwen3.5-MoE",
            ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
            ("other_layer", "linear_attention", "full_attention", "moe"),
        ),
    )
}

_BY_ARCHITECTURE = MappingProxyType(
    {
        arch: family
        for family in FAMILIES.values()
        for arch in (*family.architectures, *family.heads)
    }
)
HEAD_ARCHITECTURES = frozenset(arch for family in FAMILIES.values() for arch in family.heads)


def has_head(architectures: Iterable[str] | str | None) -> bool:
    """Whether a config's `architectures` name a classification head the table knows."""
    if isinstance(architectures, str):
        architectures = [architectures]
    return any(arch in HEAD_ARCHITECTURES for arch in architectures or ())


def family_of(architectures: Iterable[str] | str | None) -> Family | None:
    """The family of a config's `architectures` (the first one the table knows), or None."""
    if isinstance(architectures, str):
        architectures = [architectures]
    for arch in architectures or ():
        if arch in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[arch]
    return None


def read_architectures(model_path: str | Path) -> list[str]:
    """The `architectures` of a model folder's config.json ([] without one)."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    archs = config.get("architectures") or []
    return [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]


def family_of_model(model_path: str | Path) -> Family | None:
    """The family of a model folder (None: no config.json, or outside the table)."""
    return family_of(read_architectures(model_path))


def unknown_architecture_warning(architectures: list[str]) -> str:
    """What an architecture outside the table starts with."""
    named = ", ".join(architectures) if architectures else "no architectures in config.json"
    return (
        f"model architecture {named} is not in prefillonly's family table ({DOCS}): the "
        f"runtime features are on untested; `{VERIFY_COMMAND} MODEL` checks its scores "
        "against transformers feature by feature"
    )


# layer_types values of layers whose cost grows with what is cached (attention over it)
_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "attention")


def attention_layer_share(model_path: str | Path) -> float:
    """The share of a model's layers that attend over the prompt (config.json's
    `layer_types`, or its text_config's): 1.0 for a model without layer types; 0.25 for
    Qwen3.5 (3 linear : 1 full). The JCT model's attention terms scale with it."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 1.0
    types = config_fields.layer_types_of(config)
    if types is None:
        return 1.0
    return sum(t in _ATTENTION_LAYER_TYPES for t in types) / len(types)
