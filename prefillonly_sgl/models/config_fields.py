"""Fields of a model's config.json as transformers writes them, read for SGLang's model
code where SGLang reads another form (plain Python; the hooks that apply them:
sglang_runtime/model_configs.py).

- A hybrid's layer layout: ``layer_types`` (transformers' config classes), or the legacy
  ``full_attention_interval`` (the published Qwen3-Next / Qwen3.5 folders carry both;
  SGLang reads only the latter).
- Rotary parameters per layer type: transformers 5 writes OLMo 3's as
  ``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}`` with no
  top-level ``rope_theta``; SGLang's OLMo 3 reads the top-level one (10,000 by default
  where transformers' is 500,000) and the full layers' scaling from ``rope_scaling``.
"""

from __future__ import annotations

from collections.abc import Mapping

LAYER_TYPES = ("full_attention", "sliding_attention")


def full_attention_interval_of(layer_types: list[str]) -> int:
    """The k of a layout with full attention on every k-th layer (layers k-1, 2k-1, ...),
    as SGLang's Qwen3-Next / Qwen3.5 code places it; ValueError naming the layout for
    any other (that code cannot place it)."""
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    if full:
        k = full[0] + 1
        expected = [i for i in range(len(layer_types)) if (i + 1) % k == 0]
        if full == expected:
            return k
    raise ValueError(
        f"layer_types places full attention on layers {full} of {len(layer_types)}: "
        "SGLang's Qwen3-Next / Qwen3.5 model code places it on every k-th layer only "
        "(full_attention_interval); docs/models.md"
    )


def layer_types_of(config: dict) -> list[str] | None:
    """A hybrid's layer layout (config.json, or its text_config): `layer_types`, or where a
    config has only the legacy field, one full-attention layer every
    `full_attention_interval` (the others linear)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    types = config.get("layer_types") or text.get("layer_types")
    if isinstance(types, list) and types:
        return types
    interval = config.get("full_attention_interval") or text.get("full_attention_interval")
    layers = config.get("num_hidden_layers") or text.get("num_hidden_layers")
    if isinstance(interval, int) and interval > 0 and isinstance(layers, int):
        return [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    return None


def rope_by_layer_type(rope_parameters) -> tuple[float, dict | None] | None:
    """(rope_theta, the full layers' scaling or None) from rotary parameters kept per layer
    type, for model code with one theta and scaling on the full layers only (sliding
    layers default rotary); None where the parameters are not per layer type. ValueError,
    naming them, where the sliding layers' differ from that (another theta, a scaling)."""
    if not isinstance(rope_parameters, Mapping):
        return None
    # Only the per-type entries: transformers' base class, reading them as one flat set,
    # adds its own rope_type / rope_theta beside them in the same dict.
    if not any(isinstance(rope_parameters.get(kind), Mapping) for kind in LAYER_TYPES):
        return None
    full = dict(rope_parameters.get("full_attention") or {})
    sliding = dict(rope_parameters.get("sliding_attention") or {})
    theta = full.get("rope_theta", sliding.get("rope_theta"))
    if theta is None:
        return None
    if sliding and (
        sliding.get("rope_theta", theta) != theta
        or sliding.get("rope_type", "default") != "default"
    ):
        raise ValueError(
            f"rope_parameters for sliding-window layers {sliding} differ from the full "
            f"layers' theta {theta} with default rotary: SGLang's model code has one "
            "theta and scales the full layers only; docs/models.md"
        )
    scaling = full if full.get("rope_type", "default") != "default" else None
    return float(theta), scaling


def flat_rope_theta(rope_parameters) -> float | None:
    """The theta of one set of rotary parameters (transformers 5's ``rope_parameters``),
    None where there is none (or where they are kept per layer type)."""
    if not isinstance(rope_parameters, Mapping) or rope_parameters.get("rope_theta") is None:
        return None
    return float(rope_parameters["rope_theta"])


def sliding_pattern_of(layer_types: list[str] | None) -> str | None:
    """EXAONE 4's pattern string ("LLLG": the last of every k layers full) for a layout
    with sliding layers, None for one without; ValueError naming the layout where full
    attention is not on every k-th layer (SGLang's EXAONE 4 code cannot place it)."""
    if not layer_types or "sliding_attention" not in layer_types:
        return None
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    k = full[0] + 1 if full else 0
    if not full or full != [i for i in range(len(layer_types)) if (i + 1) % k == 0]:
        raise ValueError(
            f"layer_types places full attention on layers {full} of {len(layer_types)}: "
            "SGLang's EXAONE 4 model code places it on every k-th layer only "
            "(sliding_window_pattern); docs/models.md"
        )
    return "L" * (k - 1) + "G"
