"""What the pipelines share: an engine to run on, an output folder, reading results."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path


@contextlib.contextmanager
def engine_for(engine=None, model: str | None = None, device: str | None = None):
    """``engine`` itself, or an Engine on ``model`` (default: the embedded model) that is
    shut down afterwards."""
    if engine is not None:
        yield engine
        return
    from prefillonly_sgl.engine import Engine

    with Engine(model, device=device) as started:
        yield started


def add_engine_arguments(parser) -> None:
    """The options every pipeline script takes: where to run and where results go."""
    parser.add_argument("--model", help="a Hugging Face model folder (default: SmolLM2-135M)")
    parser.add_argument("--device", choices=["cpu", "cuda"])
    parser.add_argument("--out", help="folder for the results (default: a temporary one)")


def output_dir(out: str | Path | None, name: str) -> Path:
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=f"{name}-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
