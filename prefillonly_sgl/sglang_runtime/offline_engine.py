"""Start and stop SGLang's offline Engine, and read the limits it enforces.

Its helpers are its neighbours: owned_processes.py (which processes an engine started,
and killing them), worker_output.py (the workers' stderr, passed on and its last lines
kept) and worker_watch.py (a worker dying after start).

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

A worker that fails must not take the caller with it (a notebook, a batch job). SGLang's
workers report a failure by sending SIGQUIT to their parent, and SGLang's handlers for it
(the launch-phase one ``_set_envs_and_config`` installs, the running-phase one
``TokenizerManager.auto_create_handle_loop`` adds to the event loop) and its
SubprocessWatchdog (which sends that SIGQUIT when a worker dies silently, e.g. SIGKILL) all
end in ``kill_process_tree(os.getpid())``: the caller's own process is killed. For an
Engine of ours:

- while it starts, the AROUND hook on that ``kill_process_tree`` keeps the caller alive
  (the ``_STARTING`` ContextVar, seen by a signal handler since it runs in the starting
  main thread), SGLang's pipe handshake then raises, and start_sglang_engine stops the
  processes it started and raises EngineStartError with the worker's last error line
  (the workers' stderr passes through WorkerOutput, worker_output.py, which keeps its
  last lines) and the model's architecture from config.json;
- after start, a worker's SIGQUIT is ignored (our handler replaces both of SGLang's;
  ``prefillonly serve`` is SGLang's server and keeps SGLang's behaviour), SGLang's
  SubprocessWatchdog is stopped, and WorkerWatch (worker_watch.py) notices a dead worker
  itself: it stops the engine's other processes and fails the calls waiting on it with
  EngineDiedError (a dead scheduler never answers: they would wait forever).

Left: an Engine started outside the main thread cannot install a signal handler (Python
allows that only in the main thread), so there a worker's own SIGQUIT still has its default
action, which ends the process.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import signal
import sys
import threading

import psutil

from prefillonly_sgl.hooking.hooks import apply_hooks_now
from prefillonly_sgl.scoring.errors import EngineStartError
from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.sglang_runtime import redacted_settings, sglang_state, worker_forkserver
from prefillonly_sgl.sglang_runtime.owned_processes import ChildProcesses, kill_trees
from prefillonly_sgl.sglang_runtime.worker_output import WorkerOutput
from prefillonly_sgl.sglang_runtime.worker_watch import WorkerWatch

# The processes of the engine this thread is shutting down; None outside a shutdown.
_SHUTTING_DOWN: contextvars.ContextVar[list[psutil.Process] | None] = contextvars.ContextVar(
    "prefillonly_shutting_down", default=None
)
# True while this thread starts an Engine of ours (SGLang's launch-phase SIGQUIT handler
# runs in the main thread, in its context).
_STARTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "prefillonly_starting", default=False
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


def start_sglang_engine(engine_args: dict, worker_start: str = worker_forkserver.SPAWN):
    """sglang.srt.entrypoints.engine.Engine(**engine_args), with clear start-up errors;
    its workers started the ``worker_start`` way (worker_forkserver.py).

    Returns (engine, owned, watch): owned are the processes this engine started, watch
    its WorkerWatch. A worker that fails while the engine starts raises EngineStartError
    here, with the started processes stopped; the caller's process lives on."""
    try:
        from sglang.srt.entrypoints.engine import Engine as SGLangEngine
    except ImportError as e:
        raise EngineStartError(
            f"SGLang is not importable ({e}). Install it with ./run (CPU) or "
            "`pip install sglang==0.5.23` (CUDA)."
        ) from e
    if engine_args.get("device") == "cpu":
        _check_cpu_support()
    apply_hooks_now("offline_engine", HOOKS)
    redacted_settings.install_in_this_process()  # keys given to the Engine: never logged
    # multiprocessing's resource tracker outlives every engine: started now, before the
    # workers' stderr is redirected, it keeps the caller's stderr for its exit warnings.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    main_thread = threading.current_thread() is threading.main_thread()
    sigquit_before = signal.getsignal(signal.SIGQUIT) if main_thread else None
    children_before = ChildProcesses.now()
    output = WorkerOutput()
    # __new__ then __init__: a failed __init__ leaves its atexit registration of
    # engine.shutdown (the stock one, which kills every child of this process) behind,
    # and only the object lets us unregister it.
    engine = SGLangEngine.__new__(SGLangEngine)
    starting = _STARTING.set(True)
    try:
        with (
            _children_skip_main_module(),
            output.capturing(),
            worker_forkserver.workers_started(worker_start),
        ):
            engine.__init__(**engine_args)
    except BaseException as e:
        atexit.unregister(engine.shutdown)
        kill_trees(children_before.started_since())
        if main_thread and sigquit_before is not None:  # None: a handler not set from Python
            signal.signal(signal.SIGQUIT, sigquit_before)
        if not isinstance(e, Exception):
            raise
        raise EngineStartError(
            start_failure_message(engine_args.get("model_path"), e, output.last_error_line())
        ) from e
    finally:
        _STARTING.reset(starting)
    owned = children_before.started_since()
    output.mark_started()
    tokenizer_manager = engine.tokenizer_manager
    # Our WorkerWatch replaces SGLang's watchdog, whose answer to a dead worker is a
    # SIGQUIT to this process.
    sglang_watchdog = sglang_state.subprocess_watchdog(tokenizer_manager)
    if sglang_watchdog is not None:
        sglang_watchdog.stop()
    tokenizer_manager._prefillonly_caller_survives = True  # read by _keep_caller_alive
    if main_thread:
        # SGLang's launch-phase handler stays installed after start.
        signal.signal(signal.SIGQUIT, _worker_sigquit)
    _drop_loop_sigquit(tokenizer_manager)
    return engine, owned, WorkerWatch(owned, output, children_before.handles_since())


def shutdown_sglang_engine(engine, owned: list[psutil.Process], watch=None) -> None:
    """engine.shutdown(), killing only the processes in ``owned`` (and their children)."""
    if watch is not None:
        watch.stop()  # before the kills: a shutdown is no death
    apply_hooks_now("offline_engine", HOOKS)
    token = _SHUTTING_DOWN.set(owned)
    try:
        engine.shutdown()
    finally:
        _SHUTTING_DOWN.reset(token)
        # the images its prompts shared (shared_image_features.py): its scheduler is gone
        from prefillonly_sgl.sglang_runtime.shared_image_features import release_shared_images

        release_shared_images(engine.tokenizer_manager)
    # SGLang also registered engine.shutdown with atexit, which would run the stock
    # (kill every child) version at interpreter exit.
    atexit.unregister(engine.shutdown)


def _kill_owned_process_tree(original, parent_pid, include_parent=True, *args, **kwargs):
    if _STARTING.get() and parent_pid == os.getpid() and include_parent:
        # SGLang's launch-phase SIGQUIT handler: a worker of the engine this (main) thread
        # is starting failed. SGLang's pipe handshake raises next; start_sglang_engine
        # stops the processes and raises EngineStartError.
        return None
    owned = _SHUTTING_DOWN.get()
    if owned is not None and parent_pid == os.getpid() and not include_parent:
        kill_trees(owned)  # "every child of this process" -> this engine's processes
        return None
    return original(parent_pid, include_parent, *args, **kwargs)


def _keep_caller_alive(result, tokenizer_manager, *args, **kwargs):
    """AFTER TokenizerManager.auto_create_handle_loop (called at each request; it adds
    SGLang's running-phase SIGQUIT handler, kill_process_tree(os.getpid()), at the first)."""
    if getattr(tokenizer_manager, "_prefillonly_caller_survives", False):
        _drop_loop_sigquit(tokenizer_manager)
    return result


def _drop_loop_sigquit(tokenizer_manager) -> None:
    loop = tokenizer_manager.event_loop
    # SGLang adds its handler only in the main thread, where signal.signal works; an
    # Engine used from another thread (a Ray actor's, a DSL worker's) has none to drop,
    # and asyncio refuses remove_signal_handler there.
    if loop is None or threading.current_thread() is not threading.main_thread():
        return
    if loop.remove_signal_handler(signal.SIGQUIT):
        signal.signal(signal.SIGQUIT, _worker_sigquit)


def _worker_sigquit(signum, frame) -> None:
    """SIGQUIT in a process running Engines of ours: a worker saying it failed. Ignored:
    WorkerWatch notices the dead worker. (A function, not SIG_IGN, which the caller's
    own subprocesses would inherit across exec.)"""


HOOKS = {
    "sglang.srt.entrypoints.engine.kill_process_tree": ("AROUND", _kill_owned_process_tree),
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.auto_create_handle_loop": (
        "AFTER",
        _keep_caller_alive,
    ),
}


def start_failure_message(model_path, error: BaseException, worker_line: str | None) -> str:
    """What failed at start: the model, its architecture and family (models/families.py; the
    table is docs/models.md), the worker's last error line (SGLang's own error only says a
    rank died, or "see the error messages above")."""
    from prefillonly_sgl.models import families

    architectures = families.read_architectures(model_path) if model_path else []
    family = families.family_of(architectures)
    named = ", ".join(architectures)
    if family is not None:
        about = f"{family.title} family, architecture {named}; {families.DOCS}"
    elif architectures:
        about = (
            f"architecture {named} in its config.json, not in prefillonly's family table "
            f"({families.DOCS}); `{families.VERIFY_COMMAND} MODEL` checks a model outside it"
        )
    else:
        about = None  # a hub name, or a folder without config.json
    message = f"SGLang failed to start on {model_path}" + (f" ({about})" if about else "")
    if worker_line:
        return f"{message}: a worker process failed: {worker_line}"
    return f"{message}: {error}"


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
