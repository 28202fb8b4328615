"""Which asyncio event loop an SGLang offline engine answers on.

SGLang's tokenizer manager starts its result-handling task on the event loop running at
its first request (TokenizerManager.auto_create_handle_loop) and stays there. An
``await engine.async_score(...)`` on any other loop would wait forever, because nothing
on that loop ever receives the answer; this check turns that hang into an error.
"""

from __future__ import annotations

import asyncio


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
