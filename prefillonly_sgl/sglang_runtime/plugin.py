"""SGLang plugin entry point (group ``sglang.srt.plugins``, declared in pyproject.toml).

SGLang calls ``load_plugin()`` in every process it starts (the main process, the
scheduler, the detokenizer), which is how the runtime features reach the spawned workers.

The plugin is installed for the whole environment, so a stock ``python -m
sglang.launch_server`` in the same .venv would load it too. It therefore does nothing
unless the process was started by prefillonly (``prefillonly_sgl.Engine`` or ``prefillonly
serve``), which puts the resolved runtime configuration's worker part in the environment
(``runtime_enabled``); spawned workers inherit it. Each process reads it once, here, and
keeps it in process_state.py, then calls the register function of every feature it names
(features/__init__.py). Stock SGLang
stays stock, which the benchmarks rely on.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os

from prefillonly_sgl.config.runtime_config import RuntimeConfig, WorkerConfig
from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.hooks import apply_hooks_now, register_hooks
from prefillonly_sgl.machine import environment
from prefillonly_sgl.sglang_runtime import embedding_salts, head_models, model_configs

logger = logging.getLogger(__name__)

# Instruments: measuring hooks, installed (whatever the features) in a prefillonly engine
# that asks for them: the memory probe when its configuration names a file
# (WorkerConfig.memory_probe: the memory calibration's engine), the forward profile when
# its variable is set (ProcessSwitches.forward_profile: benchmarks/forward_profile.py), the
# forward log's (ProcessSwitches.forward_log: one line per extend forward, no timers), or
# the kernel profile's (ProcessSwitches.kernel_profile: stage tables when armed).
INSTRUMENTS: dict[str, str] = {
    "memory_probe": "prefillonly_sgl.sglang_runtime.memory_probe:register",
    "forward_profile": "prefillonly_sgl.sglang_runtime.forward_profile:register",
}


@contextlib.contextmanager
def runtime_enabled(config: RuntimeConfig):
    """While SGLang starts (the Engine) or runs (serve): the configuration in the
    environment, which SGLang's spawned workers inherit, and the main process's own hooks
    installed; then the environment restored, so that a later stock engine in this process
    stays stock."""
    values = config.environment()
    for name, value in config.sglang_environment_defaults().items():
        values.setdefault(name, os.environ.get(name, value))  # the user's value wins
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        # SGLang builds the model's configuration in this process too.
        apply_hooks_now("model_configs", model_configs.HOOKS)
        # A call's prompts about one image name one shared segment (inert on a tokenizer
        # manager the ScoringFront did not mark: stock engines of this process).
        from prefillonly_sgl.sglang_runtime import shared_image_features

        apply_hooks_now("shared_image_features", shared_image_features.HOOKS)
        if config.needs_tokenizer_hooks:
            # Tokenizer-side hooks run in this (the main) process, where SGLang's plugin
            # loader may already have run (see tokenizer_process.install_in_this_process).
            from prefillonly_sgl.features.prefill_kv import tokenizer_process

            tokenizer_process.install_in_this_process()
        if "prefill_kv" in config.features:
            # Where SGLang resolves its arguments: a Kev checkpoint keeps its prefix cache.
            from prefillonly_sgl.features.prefill_kv import tokenizer_process

            tokenizer_process.install_resolution_hook()
        if "prefill_attention" in config.features:
            # Where SGLang resolves its arguments (this process): a model with attention
            # sinks steered to our backend (features/prefill_attention/sink_models.py).
            from prefillonly_sgl.features.prefill_attention import (
                tokenizer_process as attention_main,
            )

            attention_main.install_in_this_process()
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _call(entry: str, *args) -> None:
    module_name, function_name = entry.split(":")
    getattr(importlib.import_module(module_name), function_name)(*args)


def load_plugin() -> None:
    config = WorkerConfig.from_environment()
    if config is None:
        return  # not a process prefillonly started: stock SGLang
    if multiprocessing.parent_process() is not None:
        _thread_lock_for_progress_bars()  # a worker of an engine prefillonly started
    switches = environment.ProcessSwitches.from_environment()
    process_state.configure(config, switches)  # where the hooks read their settings
    # Every prefillonly process, whatever its features: configurations as transformers
    # writes them (model_configs.py).
    register_hooks("model_configs", model_configs.HOOKS)
    # Every prefillonly scheduler: classification heads as their checkpoints are.
    register_hooks(head_models.TABLE_NAME, head_models.HOOKS)
    # Every prefillonly scheduler: embeddings in their tenant's cache namespace.
    register_hooks(embedding_salts.TABLE_NAME, embedding_salts.HOOKS)
    # A CPU install without CUDA: SGLang's LoRA with its host tensors unpinned.
    from prefillonly_sgl.sglang_runtime.cpu_support import lora_host_tensors

    lora_host_tensors.register()
    for name in config.features:
        _call(FEATURES[name].register)
        logger.info("prefillonly: applied runtime feature %s", name)
    if config.memory_probe:
        _call(INSTRUMENTS["memory_probe"])
    if switches.forward_profile or switches.forward_log or switches.kernel_profile:
        _call(INSTRUMENTS["forward_profile"])


def _thread_lock_for_progress_bars() -> None:
    """SGLang's workers end with SIGKILL (Engine.shutdown, serve's exit), so anything that
    registered with multiprocessing's resource tracker stays registered, and the tracker
    warns at the main process's exit ("1 leaked semaphore objects"). The one such object
    is tqdm's default write lock, a multiprocessing RLock created by the weight loader's
    progress bar; a worker's bars need only a thread lock."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
