"""Which asyncio event loop an SGLang offline engine answers on, and running a call to
its end there from synchronous code.

SGLang's tokenizer manager starts its result-handling task on the event loop running at
its first request (TokenizerManager.auto_create_handle_loop) and stays there. An
``await engine.async_score(...)`` on any other loop would wait forever, because nothing
on that loop ever receives the answer; check_running_loop_is_served turns that hang into
an error. run_to_end is Engine.run_until_complete's run on that loop, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib


def check_running_loop_is_served(sglang_engine) -> None:
    """Raise RuntimeError when awaiting a score on the running loop would never finish."""
    bound = getattr(sglang_engine.tokenizer_manager, "event_loop", None)
    if bound is None or bound is asyncio.get_running_loop():
        return
    raise RuntimeError(
        "this Engine already answers on another asyncio event loop (the one running at its "
        "first request: the engine's own loop after a synchronous call); SGLang cannot "
        "serve it from this loop. Use the synchronous API, or make every call from one "
        "loop (create the Engine and make its first call inside that loop)."
    )


def run_to_end(loop: asyncio.AbstractEventLoop, coroutine):
    """Run ``coroutine`` to its end on ``loop`` (not running: the caller is synchronous);
    its result, or its exception raised."""
    task = loop.create_task(coroutine)
    first = _completion_of(task, loop)
    try:
        loop.run_until_complete(first)
        return task.result()
    except BaseException:
        # Ctrl-C (a KeyboardInterrupt) left the loop mid-call: settle the call's tasks
        # now, or they would raise it again inside this engine's next call. The loop
        # (uvloop) keeps the interrupted run's stop callback on the future it ran, so
        # that future is never completed: its stop would end this engine's next run.
        first.abandoned = True
        task.cancel()
        while not task.done():
            with contextlib.suppress(BaseException):
                loop.run_until_complete(_completion_of(task, loop))
        raise


class _Completion(asyncio.Future):
    """A future done when a task is done (unless abandoned): what run_to_end runs."""

    abandoned = False


def _completion_of(task, loop) -> _Completion:
    done = _Completion(loop=loop)

    def finish(_):
        if not done.abandoned and not done.done():
            done.set_result(None)

    task.add_done_callback(finish)
    return done
