"""Model configurations as transformers writes them, in every prefillonly process
(the fields' rules: models/config_fields.py).

- Qwen3-Next / Qwen3.5: SGLang's configuration places full attention every
  ``full_attention_interval`` layers, a field the published config.json files carry beside
  ``layer_types``. A config written by transformers' config class alone
  (``Qwen3_5TextConfig(...)``) has only ``layer_types``, which SGLang's class takes and
  drops: a worker then died on the missing attribute. The interval is read from it.
- OLMo 3: transformers 5 keeps its rotary parameters per layer type, with no top-level
  ``rope_theta``; SGLang's configuration class then keeps its own default theta (10,000,
  transformers' is 500,000) and no scaling for the full layers, and scores wrong (stock
  SGLang too). The theta and the full layers' scaling are read from them.
"""

from __future__ import annotations

from prefillonly_sgl.models.config_fields import full_attention_interval_of, rope_by_layer_type


def _interval_from_layer_types(result, config, *args, **kwargs):
    """AFTER Qwen3NextConfig.__init__ (Qwen3.5's text configs inherit it)."""
    layer_types = kwargs.get("layer_types")
    if getattr(config, "full_attention_interval", None) is None and layer_types:
        config.full_attention_interval = full_attention_interval_of(list(layer_types))
    return result


def _rope_from_layer_types(result, config, *args, **kwargs):
    """AFTER SGLang's Olmo3Config.__init__."""
    if kwargs.get("rope_theta") is None:  # a top-level theta is SGLang's form: kept
        # as config.json has them (transformers' base class drops the per-type form)
        found = rope_by_layer_type(kwargs.get("rope_parameters"))
        if found is not None:
            config.rope_theta, config.rope_scaling = found
    return result


HOOKS = {
    "sglang.srt.configs.qwen3_next.Qwen3NextConfig.__init__": (
        "AFTER",
        _interval_from_layer_types,
    ),
    "sglang.srt.configs.olmo3.Olmo3Config.__init__": ("AFTER", _rope_from_layer_types),
}
