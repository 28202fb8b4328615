"""What SGLang is asked for when a model has attention sinks (gpt-oss): plain Python.

SGLang refuses such models on its torch_native backend ("torch_native has neither sliding
window nor attention sinks", arg_groups/model_hook.py) and, when no backend is given,
picks for gpt-oss on a CPU "intel_amx" (arg_groups/model_overrides/gpt_oss.py), which it
turns into torch_native after that check where its AMX kernels are absent. Our
prefill-only backend applies sinks and windows (windowed.py) and is registered under
both names in an engine that runs it, so on a CPU a sink model is asked for SGLang's own
choice, "intel_amx", instead of our device default "torch_native": the same backend
either way, past SGLang's check by its own route.

On CUDA (opt-in, PREFILLONLY_CUDA_SINKS=1, until a card has run its parity check):
SGLang's check holds gpt-oss to triton / trtllm_mha / fa3 / fa4 and its override picks fa3
on Hopper, none of them ours, so such a model runs stock there. With the opt-in it is
asked for "triton" (which the check allows), under which a CUDA engine that runs our
attention registers our FlashInfer backend for sink models
(scheduler_torch_backend.create_triton_backend); that backend applies the sinks from
FlashInfer's log-sum-exp in prefill (one query chunk over the whole extend,
flashinfer_chunk.py) and decode.

Why SGLang's names and not one of our own (checked against SGLang 0.5.23): the registry
itself would take any name (``attention_registry.register_attention_backend`` adds to
``ATTENTION_BACKENDS``, which the scheduler's model runner looks the resolved name up in),
but the name must first pass SGLang's argument resolution in the main process, which keys
on names it lists: ``arg_groups.model_hook.handle_model_specific_adjustments`` asserts
that a GptOssForCausalLM's prefill and decode backends are in a list local to that
function (triton, trtllm_mha, fa3, fa4, ascend, intel_amx, intel_xpu, aiter), which no
registration can extend; the ``--attention-backend`` field takes ``ATTENTION_BACKEND_CHOICES``
(extendable only by appending to that module-level list, ``add_attention_backend_choices``);
and later steps hold the resolved name to more literal sets
(``kv_cache_hook.handle_page_major_kv_layout``'s allowed backends, the KV4 checks,
speculative decoding's draft backends). A name of ours would pass only by replacing
SGLang's check or by rewriting the resolved backend after it (a resolution hook), which
leaves the steps before it deciding for one name and those after for another. So ours is
registered under the names SGLang's check allows, its factory choosing by the model
(``has_attention_sinks``) and device, and SGLang's own factory kept for everything else
(scheduler_torch_backend.register).

It also needs every layer's KV in one pool: SGLang's hybrid sliding-window pool keeps the
sliding layers in a second pool that frees tokens outside the window, which the
prefill-only kernels do not read (they fall back to the stock forward there, which has no
sinks). So a sink model gets disable_hybrid_swa_memory (SGLang's own switch, which its
Gemma 2 / 3 overrides set): sliding layers then keep every cached token, as full ones do.
"""

from __future__ import annotations

# SGLang's CPU attention backend name, which SGLang itself picks for gpt-oss on a CPU.
CPU_SINK_BACKEND = "intel_amx"
# A name SGLang's gpt-oss check allows on CUDA, under which ours runs there (opt-in).
CUDA_SINK_BACKEND = "triton"
# Our device default on CUDA (machine/device_defaults.py), which SGLang's check refuses.
CUDA_DEFAULT_BACKEND = "flashinfer"


def sink_model_fields(
    device: str | None,
    attention_backend: str | None,
    prefill_backend: str | None,
    decode_backend: str | None,
    has_sinks: bool,
    cuda_opt_in: bool = False,
) -> dict:
    """The ServerArgs fields to declare for a model (empty: leave SGLang's resolution as
    it is). Only where our backend is the one asked for (on a CPU torch_native, our device
    default, or intel_amx by name; on CUDA with the opt-in flashinfer, our device default,
    or triton by name; with no other prefill / decode backend): another backend the user
    chose keeps SGLang's own check and its own message."""
    if not has_sinks:
        return {}
    if device == "cpu":
        return ours_under_sglangs_name(
            CPU_SINK_BACKEND, attention_backend, prefill_backend, decode_backend
        )
    if device == "cuda" and cuda_opt_in:
        return ours_under_sglangs_name(
            CUDA_SINK_BACKEND,
            attention_backend,
            prefill_backend,
            decode_backend,
            default=CUDA_DEFAULT_BACKEND,
        )
    return {}


def ours_under_sglangs_name(
    name: str,
    attention_backend: str | None,
    prefill_backend: str | None,
    decode_backend: str | None,
    default: str = "torch_native",
) -> dict:
    """For a model SGLang's check holds to backend ``name`` (where ours is registered
    under it): ``default`` (our device default: torch_native on a CPU) becomes ``name``,
    with one KV pool; ``name`` asked for by the user keeps it (ours, one pool); split
    prefill / decode backends or another backend the user chose are left to SGLang's own
    check and message. Shared by sink_models and window_models."""
    if {prefill_backend, decode_backend} - {None, attention_backend}:
        return {}  # split backends the user chose: SGLang's own check and message
    if attention_backend == name:  # asked for by name: ours too (one pool)
        return {"disable_hybrid_swa_memory": True}
    if attention_backend != default:
        return {}
    return {
        "attention_backend": name,
        "prefill_attention_backend": None,
        "decode_attention_backend": None,
        "disable_hybrid_swa_memory": True,
    }
