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
- EXAONE 4: SGLang's model code reads ``rope_theta`` (1,000,000 when absent, as
  transformers 5 writes it) and takes the length of ``sliding_window_pattern`` (an
  integer as transformers writes it: a worker died on ``len(4)``). Both are set on the
  config the model is built from, in the worker only (the hook is on SGLang's model
  class, so transformers' own class stays as it is in any process). And its attention's
  q / k norms take SGLang's default epsilon (1e-6) where transformers' take the config's
  ``rms_norm_eps`` (1e-5 in the published EXAONE 4.0 folders): every prompt logprob off
  by ~1e-4 (stock SGLang too, on any device); the config's epsilon is set on them.
"""

from __future__ import annotations

from prefillonly_sgl.models.config_fields import (
    flat_rope_theta,
    full_attention_interval_of,
    rope_by_layer_type,
    sliding_pattern_of,
)


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


def _exaone4_fields(self, config, *args, **kwargs):
    """BEFORE SGLang's Exaone4ForCausalLM.__init__: the config it reads, as SGLang's code
    reads it."""
    if getattr(config, "rope_theta", None) is None:
        # Only the theta: transformers 5's rope_scaling is rope_parameters itself, which
        # SGLang's rotary factory reads by its rope_type ("default" included).
        theta = flat_rope_theta(getattr(config, "rope_parameters", None))
        if theta is not None:
            config.rope_theta = theta
    pattern = getattr(config, "sliding_window_pattern", None)
    if not isinstance(pattern, str):
        if getattr(config, "sliding_window", None) is None:
            config.sliding_window_pattern = None
        else:
            config.sliding_window_pattern = sliding_pattern_of(
                list(getattr(config, "layer_types", None) or [])
            )


def _exaone4_qk_norm_eps(result, self, *args, **kwargs):
    """AFTER SGLang's Exaone4Attention.__init__: its q / k norms with the config's epsilon,
    as transformers' EXAONE 4 has them."""
    config = kwargs.get("config", args[0] if args else None)
    eps = getattr(config, "rms_norm_eps", None)
    if eps is not None:
        self.q_norm.variance_epsilon = self.k_norm.variance_epsilon = eps
    return result


HOOKS = {
    "sglang.srt.configs.qwen3_next.Qwen3NextConfig.__init__": (
        "AFTER",
        _interval_from_layer_types,
    ),
    "sglang.srt.configs.olmo3.Olmo3Config.__init__": ("AFTER", _rope_from_layer_types),
    "sglang.srt.models.exaone4.Exaone4ForCausalLM.__init__": ("BEFORE", _exaone4_fields),
    "sglang.srt.models.exaone4.Exaone4Attention.__init__": ("AFTER", _exaone4_qk_norm_eps),
}
