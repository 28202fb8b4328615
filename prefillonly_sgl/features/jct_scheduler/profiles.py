"""Saved JCT profiles (plain Python): `prefillonly profile` writes one per model, device,
dtype and runtime features; the Engine and `serve` load the one that matches them.

    <cache>/jct-profiles/<model folder name>-<key hash>.json
    {"key": {...}, "model": {coefficients}, "fit": {R^2, errors}, "samples": [...]}
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from prefillonly_sgl.features.jct_scheduler.jct_model import FitReport, JctModel, Sample
from prefillonly_sgl.machine.device_defaults import resolved_dtype

FORMAT = 1


# Runtime features that leave a prompt's job time as it is: the scheduler itself, hybrid
# prefilling (same work in chunks; measured equal within noise, docs/hybrid_prefill.md),
# and the prompt-logprob cache (it acts on echo requests only, never on score prompts).
TIME_NEUTRAL_FEATURES = ("jct_scheduler", "hybrid_prefill", "prompt_logprobs")


def profile_key(model_path: str | Path, device: str, dtype: str, features) -> dict:
    """What a profile's numbers depend on (features: an engine's runtime patches)."""
    return {
        "model": str(Path(model_path).resolve()),
        "device": device,
        "dtype": resolved_dtype(model_path, dtype),
        "features": sorted(f for f in features if f not in TIME_NEUTRAL_FEATURES),
    }


def profiles_dir() -> Path:
    from prefillonly_sgl.models.default_model import cache_root

    return cache_root() / "jct-profiles"


def profile_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return profiles_dir() / f"{Path(key['model']).name}-{digest}.json"


def save_profile(
    key: dict, model: JctModel, fit: FitReport, samples: list[Sample], path: Path | None = None
) -> Path:
    path = Path(path) if path is not None else profile_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "format": FORMAT,
        "key": key,
        "model": model.coefficients(),
        "fit": asdict(fit),
        "samples": [{"requests": s.requests, "seconds": s.seconds} for s in samples],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    tmp.replace(path)  # never a half-written profile
    return path


def load_profile(path: str | Path) -> JctModel:
    """The model in a profile file; ValueError naming the problem."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
        return JctModel(**document["model"], source=str(path))
    except FileNotFoundError:
        raise ValueError(f"JCT profile {path} does not exist (run `prefillonly profile`)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"JCT profile {path} is not readable: {e}") from None


def find_profile(key: dict) -> JctModel | None:
    """The saved profile for `key`, or None."""
    path = profile_path(key)
    return load_profile(path) if path.is_file() else None
