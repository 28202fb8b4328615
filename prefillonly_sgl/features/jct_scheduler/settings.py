"""The JCT scheduler's settings (plain Python): resolved once from the Engine's arguments
or serve's flags (feature option jct_aging / jct_profile, features/__init__.py) and shipped to
SGLang's scheduler process inside the runtime configuration (config/runtime_config.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from prefillonly_sgl.features import JCT_POLICY  # noqa: F401  (re-exported)
from prefillonly_sgl.features.jct_scheduler.batch_budget import default_batch_tokens
from prefillonly_sgl.features.jct_scheduler.device_model import card_model, decoder_shape
from prefillonly_sgl.features.jct_scheduler.eviction import DEFAULT_EVICTION, EVICTION_POLICIES
from prefillonly_sgl.features.jct_scheduler.jct_model import DEFAULT, JctModel, default_model
from prefillonly_sgl.features.jct_scheduler.policy import (
    DEFAULT_AGING,
    DEFAULT_LONG_FACTOR,
    DEFAULT_SIZE_RATIO,
)
from prefillonly_sgl.features.jct_scheduler.profiles import find_profile, load_profile, profile_key
from prefillonly_sgl.machine.device_defaults import cuda_device_name, resolved_dtype
from prefillonly_sgl.models.families import attention_layer_share


@dataclass(frozen=True)
class JctSettings:
    model: JctModel = DEFAULT
    aging: float = DEFAULT_AGING
    long_factor: float = DEFAULT_LONG_FACTOR
    size_ratio: float = DEFAULT_SIZE_RATIO
    eviction: str = DEFAULT_EVICTION  # eviction.py
    # new tokens per planned batch of whole one-forward prompts (batch_budget.py); None:
    # stock's min(max_prefill_tokens, chunked_prefill_size)
    batch_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.batch_tokens is not None and (
            type(self.batch_tokens) is not int or self.batch_tokens < 1
        ):
            raise ValueError(
                f"JCT batch tokens must be a positive number of tokens, got {self.batch_tokens!r}"
            )
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"JCT eviction must be one of {', '.join(EVICTION_POLICIES)}, got {self.eviction!r}"
            )
        if not self.aging >= 0:
            raise ValueError(f"JCT aging must be >= 0 (seconds per second waited): {self.aging}")
        if not self.long_factor > 0 or not self.size_ratio >= 1:
            raise ValueError(
                f"JCT long_factor must be > 0 and size_ratio >= 1, got {self.long_factor}, "
                f"{self.size_ratio}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> JctSettings:
        return cls(**{**values, "model": JctModel(**values["model"])})

    @classmethod
    def resolve(
        cls,
        context,
        jct_aging: float | None = None,
        jct_profile=None,
        jct_eviction=None,
        jct_batch_tokens: int | None = None,
    ) -> JctSettings:
        """The feature registry's resolver (features/__init__.py): `context` is runtime_config's
        FeatureContext (model, device, dtype, features)."""
        return resolve_settings(
            context.model_path,
            context.device,
            context.dtype,
            context.features,
            jct_aging,
            jct_profile,
            jct_eviction,
            jct_batch_tokens,
        )


def built_in_model(model_path: str | Path, device: str, dtype: str) -> JctModel:
    """Without a profile: on a card, the model's shape over the card's rates
    (device_model.py); elsewhere, or for a shape it cannot read, the CPU's built-in model
    of the dtype. Either was made for a network whose every layer attends: a hybrid's
    attention terms scale with its attention layers' share."""
    model = None
    if device == "cuda":
        shape = decoder_shape(model_path)
        if shape is not None:
            model = card_model(shape, cuda_device_name())
    if model is None:
        model = default_model(resolved_dtype(model_path, dtype))
    return model.with_attention_share(attention_layer_share(model_path))


def resolve_settings(
    model_path: str | Path,
    device: str,
    dtype: str,
    features,
    aging: float | None = None,
    profile: str | Path | None = None,
    eviction: str | None = None,
    batch_tokens: int | None = None,
) -> JctSettings:
    """The settings an engine starts with: the profile given, else the saved profile of
    this model / device / dtype / runtime features (`prefillonly profile` writes it), else
    the built-in model (built_in_model: the card's estimate on CUDA, the CPU's per
    dtype); aging None: DEFAULT_AGING; eviction None: DEFAULT_EVICTION; batch_tokens
    None: the device's default (batch_budget.py)."""
    if profile is not None:
        model = load_profile(profile)
    else:
        model = find_profile(profile_key(model_path, device, dtype, features)) or built_in_model(
            model_path, device, dtype
        )
    return JctSettings(
        model=model,
        aging=DEFAULT_AGING if aging is None else aging,
        eviction=eviction or DEFAULT_EVICTION,
        batch_tokens=batch_tokens if batch_tokens is not None else default_batch_tokens(device),
    )
