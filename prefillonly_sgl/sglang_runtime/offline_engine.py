"""Start and stop SGLang's offline Engine, and read the limits it enforces.

SGLang starts its scheduler and detokenizer with multiprocessing "spawn". A spawned child
re-imports the parent's ``__main__`` script, so a script (or notebook-exported file) that
creates an Engine at module level, without ``if __name__ == "__main__":``, would create
another Engine inside the child and die ("An attempt has been made to start a new process
before the current process has finished its bootstrapping phase"). The children only run
SGLang's own functions, so while they start we hide the main script from multiprocessing
and they skip re-importing it.

SGLang's Engine.shutdown() kills *every* child process of the caller
(``kill_process_tree(os.getpid(), include_parent=False)``): a second Engine in the same
process, the user's own workers, and multiprocessing's resource tracker (whose death makes
Python print a KeyError traceback at exit). ``shutdown_sglang_engine`` narrows that to the
processes this engine started: an AROUND hook on the name Engine.shutdown calls kills only
the processes in _SHUTTING_DOWN, which holds the engine being shut down in this thread
(a ContextVar, so two engines shutting down from two threads each kill their own).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import sys

import psutil

from prefillonly_sgl.errors import EngineStartError
from prefillonly_sgl.hooking.hooks import apply_hooks_now
from prefillonly_sgl.validation import ModelLimits

# The processes of the engine this thread is shutting down; None outside a shutdown.
_SHUTTING_DOWN: contextvars.ContextVar[list[psutil.Process] | None] = contextvars.ContextVar(
    "prefillonly_shutting_down", default=None
)


@contextlib.contextmanager
def _children_skip_main_module():
    main = sys.modules.get("__main__")
    saved = {name: getattr(main, name) for name in ("__file__", "__spec__") if hasattr(main, name)}
    try:
        # multiprocessing.spawn.get_preparation_data() re-runs __main__ in the child from
        # __spec__.name (python -m) or __file__ (python script.py); without both it doesn't.
        for name in saved:
            if name == "__spec__":
                main.__spec__ = None
            else:
                delattr(main, name)
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


def start_sglang_engine(engine_args: dict):
    """sglang.srt.entrypoints.engine.Engine(**engine_args), with clear start-up errors.

    Returns (engine, owned): owned are the processes this engine started."""
    try:
        from sglang.srt.entrypoints.engine import Engine as SGLangEngine
    except ImportError as e:
        raise EngineStartError(
            f"SGLang is not importable ({e}). Install it with ./run (CPU) or "
            "`pip install sglang==0.5.23` (CUDA)."
        ) from e
    if engine_args.get("device") == "cpu":
        _check_cpu_support()
    children_before = _child_pids()
    try:
        with _children_skip_main_module():
            engine = SGLangEngine(**engine_args)
    except Exception as e:
        raise EngineStartError(
            f"SGLang failed to start on {engine_args.get('model_path')}: {e}"
        ) from e
    owned = [psutil.Process(pid) for pid in _child_pids() - children_before - _tracker_pids()]
    return engine, owned


def shutdown_sglang_engine(engine, owned: list[psutil.Process]) -> None:
    """engine.shutdown(), killing only the processes in ``owned`` (and their children)."""
    apply_hooks_now("offline_engine", SHUTDOWN_HOOKS)
    token = _SHUTTING_DOWN.set(owned)
    try:
        engine.shutdown()
    finally:
        _SHUTTING_DOWN.reset(token)
    # SGLang also registered engine.shutdown with atexit, which would run the stock
    # (kill every child) version at interpreter exit.
    atexit.unregister(engine.shutdown)


def _kill_owned_process_tree(original, parent_pid, include_parent=True, *args, **kwargs):
    owned = _SHUTTING_DOWN.get()
    if owned is not None and parent_pid == os.getpid() and not include_parent:
        _kill_trees(owned)  # "every child of this process" -> this engine's processes
        return None
    return original(parent_pid, include_parent, *args, **kwargs)


SHUTDOWN_HOOKS = {
    "sglang.srt.entrypoints.engine.kill_process_tree": ("AROUND", _kill_owned_process_tree),
}


def _kill_trees(roots: list[psutil.Process], timeout: float = 60) -> None:
    victims = []
    for root in roots:
        try:
            victims += root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            continue
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=timeout)


def _child_pids() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def _tracker_pids() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if pid else set()


def _check_cpu_support() -> None:
    from prefillonly_sgl.sglang_runtime.cpu_support import boot

    if not boot.is_active():
        raise EngineStartError(
            "SGLang's CPU support is not active in this environment: create it with "
            "scripts/setup.sh (or ./run), which installs the .pth hook that loads "
            "prefillonly_sgl.sglang_runtime.cpu_support in SGLang's worker processes."
        )


def read_start_info(sglang_engine) -> tuple[ModelLimits, str | None]:
    """What the engine's scheduler reported at start-up, read once (get_server_info asks
    the scheduler): the limits (the score limit is the context length where prefill-only
    KV is active there, the pool-bound one otherwise) and, where that feature was asked
    for and is off, why."""
    from prefillonly_sgl.features.prefill_kv.messages import off_reason_in
    from prefillonly_sgl.sglang_runtime.model_limits import limits_from_scheduler_info

    # get_server_info() merges the scheduler's init info into its answer.
    info = sglang_engine.get_server_info()
    vocab_size = sglang_engine.tokenizer_manager.model_config.vocab_size
    return limits_from_scheduler_info(info, vocab_size), off_reason_in(info)
