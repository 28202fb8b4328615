"""An Engine's start and the stop of what it started (engine.py's Engine keeps the API).

Before the start: the configuration's start-up warnings (warn_at_start) and its memory
budget planned (plan_memory: the pool it leaves, measured once with an engine of the same
configuration). start() merges SGLang's arguments (the device defaults, the user's, the
configuration's own fields), starts SGLang's offline engine under the runtime
configuration (offline_engine.py; its workers the way worker_forkserver.py says), reads
what the scheduler reported at start (the limits; why prefill-only KV is off where it was
asked for: then a warning) and builds the scoring front over its tokenizer manager. The
processes it started are stopped by one finalizer: called by Engine.shutdown(), when the
Engine is collected, and at interpreter exit (an Engine the user forgets to shut down
leaves no SGLang process behind).

Importing this module imports none of SGLang: start() imports the runtime when it runs.
"""

from __future__ import annotations

import atexit
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefillonly_sgl.config.runtime_config import RuntimeConfig
from prefillonly_sgl.memory.budget import MemoryPlan
from prefillonly_sgl.scoring.validation import ModelLimits

if TYPE_CHECKING:
    from prefillonly_sgl.sglang_runtime.score_front import ScoringFront
    from prefillonly_sgl.sglang_runtime.worker_watch import WorkerWatch


@dataclass(frozen=True)
class StartedEngine:
    """What start() gives the Engine: SGLang's offline engine, the watch on its workers,
    the finalizer that stops them, the limits its scheduler reported, and the front."""

    sgl: object
    watch: WorkerWatch
    finalizer: weakref.finalize
    limits: ModelLimits
    front: ScoringFront


def warn_at_start(config: RuntimeConfig) -> None:
    """The configuration's start-up warnings (features its model family cannot run, an
    architecture outside the table), once per Engine, attributed to the Engine's caller.
    A warning, not a log line: SGLang sets the root logger to its log level ("error" by
    default) in this process."""
    for message in config.start_warnings():
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def plan_memory(
    config: RuntimeConfig, start_engine: Callable[[RuntimeConfig], object]
) -> MemoryPlan:
    """The KV pool the configuration's memory budget leaves (memory/measurement.py),
    measured if needed with ``start_engine`` (Engine.from_config) of the same
    configuration and a small pool."""
    from prefillonly_sgl.memory import measurement

    hybrid = config.settings("hybrid_prefill")
    return measurement.plan(
        config.memory.budget,
        lambda pool, probe: start_engine(config.with_pool(pool).with_memory_probe(probe)),
        model_path=config.model_path,
        device=config.device,
        dtype=config.dtype,
        features=config.features,
        chunk_size=hybrid.chunk_size if hybrid else None,
        hybrid_mode=hybrid.mode if hybrid else None,
        max_prompt_tokens=config.memory.max_prompt_tokens,
        context_length=config.context_length,
    )


def start(owner, config: RuntimeConfig, sglang_args: dict) -> StartedEngine:
    """SGLang's offline engine for ``owner`` (the Engine: the finalizer runs when it is
    collected), with ``config``; sglang_args: the user's other ServerArgs fields. A
    warning (attributed to the Engine's caller) where prefill-only KV was asked for and the
    scheduler did not enable it."""
    from prefillonly_sgl.sglang_runtime import worker_forkserver
    from prefillonly_sgl.sglang_runtime.offline_engine import (
        read_start_info,
        shutdown_sglang_engine,
        start_sglang_engine,
    )
    from prefillonly_sgl.sglang_runtime.plugin import runtime_enabled
    from prefillonly_sgl.sglang_runtime.score_front import ScoringFront

    # User values win over the device defaults; the configuration's own fields (the
    # model, the pool of a memory plan, SGLang's policy under JCT) over both.
    args = {
        **config.sglang_defaults(),
        "log_level": "error",
        **sglang_args,
        **config.sglang_fields(),
    }
    worker_start = worker_forkserver.start_mode()  # before runtime_enabled
    with runtime_enabled(config):
        sgl, owned_processes, watch = start_sglang_engine(args, worker_start)
    # An Engine the user forgets to shut down must not leave SGLang processes behind.
    finalizer = weakref.finalize(
        owner,
        _shutdown_quietly,
        shutdown_sglang_engine,
        sgl,
        owned_processes,
        watch,
    )
    limits, prefill_kv_off_reason = read_start_info(sgl)
    front = ScoringFront(sgl.tokenizer_manager, limits)
    atexit.register(finalizer)
    prefill_only_kv_active = limits.max_scoring_prompt_tokens is not None
    if "prefill_kv" in config.features and not prefill_only_kv_active:
        # A warning, not a log line: SGLang sets the root logger to its log level
        # ("error" by default) in this process.
        reason = prefill_kv_off_reason or "the scheduler's log says why"
        warnings.warn(
            "prefill-only KV was requested but SGLang's scheduler did not enable it for "
            f"this model / backend ({reason}): score prompts keep KV for every token "
            "and are bounded by the KV pool",
            RuntimeWarning,
            stacklevel=4,  # start <- Engine._start <- Engine() / from_config <- the caller
        )
    return StartedEngine(sgl, watch, finalizer, limits, front)


def _shutdown_quietly(shutdown, sgl_engine, owned_processes, watch) -> None:
    try:
        shutdown(sgl_engine, owned_processes, watch)
    except Exception:  # interpreter teardown: the processes are being killed anyway
        pass
