"""Which architectures outside the family table may start (plain Python, no SGLang).

An architecture outside the table (models/families.py) runs prefillonly's features
untested: it starts only once `prefillonly verify MODEL` has passed on a checkpoint of
the same configuration (recorded here, by its config.json's hash), or where the user
opts in by name (Engine(allow_architectures=[...]), serve's --allow-architecture);
otherwise the start is refused, saying how to verify. Never a wrong number behind a
warning alone.

A record is one JSON file per verified configuration under the cache root
(`$PREFILLONLY_CACHE/verified/`, models/default_model.cache_root): the architecture, the
hash, the folder verify ran on, when, on which device and dtype, and its largest
difference. The hash covers config.json without the fields that name a copy rather than a
model (its path, the transformers version that wrote it, the dtype it was saved in), so a
copy of the same checkpoint, or the same architecture and shapes saved again, finds it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from prefillonly_sgl.models.families import DOCS, VERIFY_COMMAND

# config.json fields that name a copy of a model, not the model
_COPY_FIELDS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache")


class UnverifiedArchitectureError(ValueError):
    """An architecture outside the family table, neither verified nor allowed by name."""


def config_hash(model_path: str | Path) -> str | None:
    """The hash of a model folder's config.json (None without a readable one)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    kept = {k: v for k, v in config.items() if k not in _COPY_FIELDS}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def records_dir() -> Path:
    from prefillonly_sgl.models.default_model import cache_root

    return cache_root() / "verified"


def find_record(model_path: str | Path, folder: Path | None = None) -> dict | None:
    """The record of a passed verify for this folder's configuration, if any."""
    digest = config_hash(model_path)
    if digest is None:
        return None
    path = (folder or records_dir()) / f"{digest}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("config_hash") == digest else None


def write_record(
    model_path: str | Path,
    architectures: list[str],
    device: str,
    dtype: str,
    max_diff: float | None,
    folder: Path | None = None,
) -> Path:
    """Records a passed verify of this folder's configuration; returns the file."""
    digest = config_hash(model_path)
    if digest is None:
        raise ValueError(f"{model_path}: no readable config.json to record")
    folder = folder or records_dir()
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "config_hash": digest,
        "architectures": list(architectures),
        "model_path": str(model_path),
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "dtype": dtype,
        "max_diff": max_diff,
    }
    path = folder / f"{digest}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def check_may_start(
    model_path: str | Path,
    architectures: list[str],
    allowed: tuple[str, ...] = (),
    style: str = "engine",
    folder: Path | None = None,
) -> str:
    """For an architecture outside the table: why it may start ("allowed by name" or the
    verify record's date), or UnverifiedArchitectureError naming how to verify or opt in."""
    named = [a for a in architectures if a in allowed]
    if named:
        return f"allowed by name ({', '.join(named)})"
    record = find_record(model_path, folder)
    if record is not None:
        return f"verified on {record.get('verified_at', '?')} ({record.get('device', '?')})"
    shown = ", ".join(architectures) if architectures else "no architectures in config.json"
    first = architectures[0] if architectures else "ARCHITECTURE"
    opt_in = (
        f"allow_architectures=[{first!r}]" if style == "engine" else f"--allow-architecture {first}"
    )
    raise UnverifiedArchitectureError(
        f"model architecture {shown} is not in prefillonly's family table ({DOCS}), and "
        f"this configuration has not been verified: run `{VERIFY_COMMAND} {model_path} "
        "--quick` (about a minute for a small model on a CPU: it checks the scores against "
        "transformers feature by feature and, when every one matches, records the "
        "configuration, which then starts with the features, no opt-in), or opt in by name "
        f"with {opt_in} to run the features untested"
    )
