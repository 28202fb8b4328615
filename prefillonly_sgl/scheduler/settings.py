"""The JCT scheduler's settings, from the Engine's arguments or serve's flags to SGLang's
scheduler process (plain Python). They travel in one environment variable, set while
SGLang starts (its workers inherit the environment), next to PREFILLONLY_PATCHES.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from prefillonly_sgl.scheduler.jct_model import DEFAULT, JctModel, default_model
from prefillonly_sgl.scheduler.policy import DEFAULT_AGING, DEFAULT_LONG_FACTOR, DEFAULT_SIZE_RATIO
from prefillonly_sgl.scheduler.profiles import (
    find_profile,
    load_profile,
    profile_key,
    resolved_dtype,
)

JCT_SETTINGS_ENV = "PREFILLONLY_JCT_SETTINGS"
JCT_POLICY = "jct"  # --schedule-policy jct / Engine(schedule_policy="jct"): the default


@dataclass(frozen=True)
class JctSettings:
    model: JctModel = DEFAULT
    aging: float = DEFAULT_AGING
    long_factor: float = DEFAULT_LONG_FACTOR
    size_ratio: float = DEFAULT_SIZE_RATIO

    def __post_init__(self) -> None:
        if not self.aging >= 0:
            raise ValueError(f"JCT aging must be >= 0 (seconds per second waited): {self.aging}")
        if not self.long_factor > 0 or not self.size_ratio >= 1:
            raise ValueError(
                f"JCT long_factor must be > 0 and size_ratio >= 1, got {self.long_factor}, "
                f"{self.size_ratio}"
            )

    def to_env(self) -> str:
        values = asdict(self)
        return json.dumps(values)

    @classmethod
    def from_env(cls, environ=os.environ) -> JctSettings | None:
        raw = environ.get(JCT_SETTINGS_ENV)
        if not raw:
            return None
        values = json.loads(raw)
        return cls(**{**values, "model": JctModel(**values["model"])})


def resolve_settings(
    model_path: str | Path,
    device: str,
    dtype: str,
    features,
    aging: float | None = None,
    profile: str | Path | None = None,
) -> JctSettings:
    """The settings an engine starts with: the profile given, else the saved profile of
    this model / device / dtype / runtime features (`prefillonly profile` writes it), else
    the built-in model of that dtype; aging None: DEFAULT_AGING."""
    if profile is not None:
        model = load_profile(profile)
    else:
        model = find_profile(profile_key(model_path, device, dtype, features)) or default_model(
            resolved_dtype(model_path, dtype)
        )
    return JctSettings(model=model, aging=DEFAULT_AGING if aging is None else aging)
