"""Per-device SGLang engine arguments (plain Python: no SGLang, no torch at import).

CPU: the torch_native attention backend (SGLang's only CPU one), a bounded KV pool,
because SGLang sizes the default pool from *system* memory there (~15 GB, 18 s to
allocate on a 24 GiB machine), and an idle scheduler that sleeps instead of spinning.
GPU: flashinfer attention, SGLang's own pool sizing.
"""

from __future__ import annotations

import os

# 16k tokens of KV: ~0.75 GB for the default model in float32, enough for its 8k context.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 16384


def detect_device() -> str:
    """ "cuda" when a CUDA GPU is usable, else "cpu". PREFILLONLY_DEVICE overrides."""
    forced = os.environ.get("PREFILLONLY_DEVICE")
    if forced:
        return forced
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sglang_engine_args(model_path: str, device: str, **overrides) -> dict:
    """Keyword arguments for sglang's Engine; explicit overrides win over the defaults."""
    args: dict = {"model_path": model_path, "device": device, "log_level": "error"}
    if device == "cpu":
        args.update(
            attention_backend="torch_native",
            max_total_tokens=CPU_DEFAULT_MAX_TOTAL_TOKENS,
            # SGLang's scheduler busy-polls while idle unless told to sleep: measured 7.35
            # CPU seconds in 8 idle seconds (a whole core), ~0.1 with this. Requests still
            # wake it at once (zmq poll).
            sleep_on_idle=True,
        )
    elif device == "cuda":
        args.update(attention_backend="flashinfer")
    else:
        raise ValueError(f"unsupported device {device!r}: expected 'cpu' or 'cuda'")
    args.update({k: v for k, v in overrides.items() if v is not None})
    return args
