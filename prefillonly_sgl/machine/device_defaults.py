"""Per-device SGLang engine arguments (plain Python: no SGLang, no torch at import).

CPU: the torch_native attention backend (SGLang's only CPU one), a bounded KV pool,
because SGLang sizes the default pool from *system* memory there (~15 GB, 18 s to
allocate on a 24 GiB machine), and an idle scheduler that sleeps instead of spinning.
GPU: flashinfer attention, SGLang's own pool sizing.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefillonly_sgl.machine import environment

# 16k tokens of KV: ~0.75 GB for the default model in float32, enough for its 8k context.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384


def detect_device() -> str:
    """ "cuda" when a CUDA GPU is usable, else "cpu". PREFILLONLY_DEVICE overrides."""
    forced = environment.read(environment.DEVICE)
    if forced:
        return forced
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_device_name() -> str:
    """The CUDA card's name (torch's), or "CUDA" where none answers (a configuration made
    for a card on a machine without one)."""
    import torch

    try:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "CUDA"
    except RuntimeError:
        return "CUDA"


def folder_dtype(model_path: str | Path) -> str | None:
    """The dtype a Hugging Face folder's config.json names, or None."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("torch_dtype") or config.get("dtype")
    return str(value) if value else None


def resolve_dtype(model_path: str | Path, device: str, dtype: str | None) -> str | None:
    """The dtype to ask SGLang for. "auto" means the folder's dtype, as documented; but
    SGLang's "auto" runs a float32 folder in float16 (its GPU habit), and on a CPU float16
    has no fast kernels: the default model (a float32 folder) ran 3.5x slower than in
    float32 and 5x slower than in bfloat16 (a 2k-token prompt: 14.6 s vs 4.1 s vs 2.9 s on
    the 2-core dev machine). So on CPU "auto" becomes the folder's own dtype; on GPU it
    stays SGLang's choice (float16 is fast there)."""
    if dtype not in (None, "auto") or device != "cpu":
        return dtype
    return folder_dtype(model_path) or dtype


def resolved_dtype(model_path: str | Path, dtype: str) -> str:
    """dtype as the engine runs it, for keying what is measured per dtype (job-time
    profiles, memory calibrations): "auto" is the folder's own (config.json)."""
    if dtype != "auto":
        return dtype
    if not (Path(model_path) / "config.json").exists():
        return "auto"
    return folder_dtype(model_path) or "float32"


def sglang_defaults(device: str) -> dict:
    """The ServerArgs fields prefillonly sets for `device` unless the user gave them (the
    Engine as keyword arguments, `serve` as flags: config/runtime_config.py)."""
    if device == "cpu":
        return dict(
            attention_backend="torch_native",
            max_total_tokens=CPU_DEFAULT_MAX_TOTAL_TOKENS,
            # SGLang's scheduler busy-polls while idle unless told to sleep: measured 7.35
            # CPU seconds in 8 idle seconds (a whole core), ~0.1 with this (two replicas on
            # a 2-core machine starved each other). Requests still wake it at once (zmq).
            sleep_on_idle=True,
            # SGLang's default LoRA backends are Triton kernels (CUDA); its torch one runs
            # on a CPU (with cpu_support's host tensors unpinned). Read only with --enable-lora.
            lora_backend="torch_native",
        )
    if device == "cuda":
        return dict(attention_backend="flashinfer")
    raise ValueError(f"unsupported device {device!r}: expected 'cpu' or 'cuda'")
