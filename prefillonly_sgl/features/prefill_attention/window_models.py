"""What SGLang is asked for when its check wants a GPU attention backend for a model's
sliding windows (EXAONE 4): plain Python.

For EXAONE 4 (and EXAONE MoE) with a sliding-window pattern, SGLang asserts an attention
backend among fa3 / triton / trtllm_mha (arg_groups/model_hook.py), none of which runs on
a CPU (triton there: "0 active drivers"); with no backend given it picks "triton" on a
CPU itself (arg_groups/model_overrides/exaone.py). Our prefill-only backend applies the
windows (windowed.py) and, in an engine that runs it, is registered under "triton" for a
CPU runner, so on a CPU such a model is asked for "triton" instead of our device default
"torch_native": our backend, past SGLang's check by SGLang's own choice of name.

Every layer's KV stays in one pool (disable_hybrid_swa_memory, which SGLang's EXAONE
override sets too: its hybrid pool is not supported for them), as for attention sinks
(sink_models.py).
"""

from __future__ import annotations

from prefillonly_sgl.features.prefill_attention.sink_models import ours_under_sglangs_name

# SGLang's own choice for these models on a CPU; ours there (scheduler_torch_backend.py).
CPU_WINDOW_BACKEND = "triton"
# Architectures SGLang's check holds to a GPU backend when they have windows.
GPU_WINDOW_ARCHITECTURES = ("Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM")


def window_model_fields(
    device: str | None,
    attention_backend: str | None,
    prefill_backend: str | None,
    decode_backend: str | None,
    architecture: str | None,
    has_windows: bool,
) -> dict:
    """The ServerArgs fields to declare for a model (empty: leave SGLang's resolution as
    it is). Only on a CPU, for an architecture SGLang holds to a GPU backend for its
    windows, where our backend is the one asked for (torch_native, our device default,
    or triton by name, with no other prefill / decode backend)."""
    if device != "cpu" or architecture not in GPU_WINDOW_ARCHITECTURES or not has_windows:
        return {}
    return ours_under_sglangs_name(
        CPU_WINDOW_BACKEND, attention_backend, prefill_backend, decode_backend
    )
