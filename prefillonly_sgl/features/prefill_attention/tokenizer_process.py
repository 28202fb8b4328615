"""Prefill-only attention in the main (tokenizer) process: where SGLang resolves its
server arguments, a model with attention sinks (gpt-oss) or with windows SGLang holds to
a GPU backend (EXAONE 4) is steered to our backend past SGLang's backend check
(sink_models.py and window_models.py say what and why).

The route is SGLang's own plugin API for resolution steps (register_resolution_hook): a
wrapper of "handle_cpu_backends", the step that picks the CPU attention backend and runs
before the model-specific check. The wrapper is inert unless the process runs an engine
with prefill-only attention (the runtime configuration in the environment, set by
plugin.runtime_enabled while SGLang starts).
"""

from __future__ import annotations

from prefillonly_sgl.features.prefill_attention.sink_models import sink_model_fields
from prefillonly_sgl.features.prefill_attention.window_models import window_model_fields

_installed = False
SOURCE = "prefillonly: prefill-only attention applies attention sinks and sliding windows"


def _handle_cpu_backends(server_args, previous) -> None:
    previous(server_args)
    from prefillonly_sgl.config.runtime_config import WorkerConfig

    config = WorkerConfig.from_environment()
    if config is None or "prefill_attention" not in config.features:
        return  # stock SGLang, or an engine without our attention
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from prefillonly_sgl.machine.environment import ProcessSwitches

    cfg = resolving_view(server_args)
    # the opt-in for sinks on CUDA, read with the configuration (this process's SGLang
    # workers read the same variable as their ProcessSwitches)
    cuda_sinks = cfg.device == "cuda" and ProcessSwitches.from_environment().cuda_sinks
    if cfg.device != "cpu" and not cuda_sinks:
        return
    model = _model_config(server_args)
    backends = (cfg.attention_backend, cfg.prefill_attention_backend, cfg.decode_attention_backend)
    hf_config = model.hf_config
    architecture = (getattr(hf_config, "architectures", None) or [None])[0]
    fields = sink_model_fields(
        cfg.device, *backends, bool(model.has_attention_sinks), cuda_sinks
    ) or window_model_fields(
        cfg.device,
        *backends,
        architecture,
        getattr(hf_config, "sliding_window_pattern", None) is not None,
    )
    if fields:
        declare_resolution(server_args, SOURCE, **fields)


def _model_config(server_args):
    """SGLang's ModelConfig of the arguments. SGLang memoizes the one it builds on them
    (model_config_of); building that memo here, before the later steps have resolved
    their fields (dtype, context length, the hybrid pool switch declared above), would
    freeze their earlier values in it, so a memo is used only where SGLang made one
    already, else a throwaway ModelConfig is built."""
    from sglang.srt.configs.model_config import ModelConfig

    memo = getattr(server_args, "_model_config", None)
    return memo if memo is not None else ModelConfig.from_server_args(server_args)


def install_in_this_process() -> None:
    """Registers the wrapper once per process (SGLang keeps registrations for good)."""
    global _installed
    if _installed:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook("handle_cpu_backends")(_handle_cpu_backends)
    _installed = True
